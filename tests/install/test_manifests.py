"""The plain manifests: `kubectl apply -f manifests/` installs a least-privilege operator."""

from __future__ import annotations

import pytest
import yaml

from kubeserve.schema.resources import ServeApplicationSpec, ServeInstanceSpec
from support.kubeserve_install import (
    K8S_VERSIONS,
    LEADER_ELECTION_RULES,
    MANIFESTS,
    NAMESPACE,
    OPERATOR_CLUSTER_RULES,
    OPERATOR_NAMESPACED_RULES,
    find,
    manifest_files,
    one,
    operator_container,
    plain_manifests,
    rules_of,
    validate,
)

CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "FlowSchema",
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_strictly(version: str) -> None:
    objects = plain_manifests()
    assert objects
    for obj in objects:
        validate(obj, version)


def test_strict_validation_rejects_unknown_fields() -> None:
    """Guards the test above: a misspelt field must fail, not pass silently."""
    deployment = dict(one(plain_manifests(), "Deployment"))
    deployment["spec"] = {**deployment["spec"], "replicaz": 1}
    with pytest.raises(Exception, match="replicaz"):
        validate(deployment, K8S_VERSIONS[0])


def test_files_apply_in_dependency_order() -> None:
    """kubectl applies the files in name order: the namespace, then the CRDs, then the rest."""
    assert all(p.name[:2].isdigit() and p.name[2] == "-" for p in manifest_files())
    kinds = [o["kind"] for o in plain_manifests()]
    assert kinds[0] == "Namespace"
    crds = [i for i, kind in enumerate(kinds) if kind == "CustomResourceDefinition"]
    assert crds == list(range(1, 1 + len(crds)))
    assert kinds.index("Deployment") > kinds.index("ClusterRoleBinding")
    assert kinds.index("Deployment") > kinds.index("ServiceAccount")


def test_namespaced_objects_live_in_kubeserve_system() -> None:
    assert one(plain_manifests(), "Namespace")["metadata"]["name"] == NAMESPACE
    for obj in plain_manifests():
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]


def test_cluster_role_is_exactly_the_least_privilege_set() -> None:
    role = one(plain_manifests(), "ClusterRole", "kubeserve-operator")
    assert rules_of(role) == OPERATOR_NAMESPACED_RULES | OPERATOR_CLUSTER_RULES
    binding = one(plain_manifests(), "ClusterRoleBinding", "kubeserve-operator")
    assert binding["roleRef"]["name"] == "kubeserve-operator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kubeserve-operator", "namespace": NAMESPACE}
    ]
    assert one(plain_manifests(), "ServiceAccount", "kubeserve-operator")


def test_secrets_are_only_created_and_read_and_no_wildcards_or_escalation() -> None:
    """The operator creates each instance's data-plane Secret and reads it back; it can neither
    list nor watch Secrets (so it never sees other Secrets' values), nor change or delete them."""
    for role in find(plain_manifests(), "ClusterRole"):
        for group, resource, verb in rules_of(role):
            assert "*" not in (group, resource, verb)
            if resource == "secrets":
                assert verb in {"get", "create"}
            assert verb not in {"escalate", "bind", "impersonate"}


def test_operator_deployment_runs_the_operator_restricted_and_probed() -> None:
    objects = plain_manifests()
    deployment = one(objects, "Deployment", "kubeserve-operator")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "--leader-election-lease=kubeserve-operator" in container["args"]
    assert pod["serviceAccountName"] == "kubeserve-operator"
    assert container["image"] == "kubeserve:0.1.0"
    assert container["command"] == ["kubeserve"]
    assert container["args"][0] == "operator"
    assert "--namespace=$(KUBESERVE_NAMESPACE)" in container["args"]
    assert "--dashboard-port=8265" in container["args"]
    assert {
        "name": "KUBESERVE_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]
    assert {"name": "admin", "containerPort": 8265, "protocol": "TCP"} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/-/healthz", "port": "admin"}
    assert set(container["resources"]) == {"requests", "limits"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_replicas_may_renew_only_their_lease_and_go_one_at_a_time() -> None:
    objects = plain_manifests()
    role = one(objects, "Role", "kubeserve-operator-leader-election")
    assert rules_of(role) == LEADER_ELECTION_RULES
    assert role["rules"][1] == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["kubeserve-operator"],
        "verbs": ["get", "update", "patch"],
    }
    binding = one(objects, "RoleBinding", "kubeserve-operator-leader-election")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kubeserve-operator", "namespace": NAMESPACE}
    ]
    # their Lease requests in the leader-election priority level, theirs alone
    schema = one(objects, "FlowSchema", "kubeserve-operator-leader-election")["spec"]
    assert schema["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert [rule["subjects"] for rule in schema["rules"]] == [
        [
            {
                "kind": "ServiceAccount",
                "serviceAccount": {"name": "kubeserve-operator", "namespace": NAMESPACE},
            }
        ]
    ]
    budget = one(objects, "PodDisruptionBudget", "kubeserve-operator")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def test_admin_service_reaches_the_operator_pod() -> None:
    objects = plain_manifests()
    service = one(objects, "Service", "kubeserve-admin")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "admin", "port": 8265, "targetPort": "admin", "protocol": "TCP"}
    ]


def test_example_custom_resources_are_valid() -> None:
    """manifests/examples/hello.yaml (used by `make e2e-kind`) passes the kubeserve models."""
    docs = list(yaml.safe_load_all((MANIFESTS / "examples" / "hello.yaml").read_text()))
    instance = one(docs, "ServeInstance", "default")
    application = one(docs, "ServeApplication", "hello")
    ServeInstanceSpec.model_validate(instance["spec"])
    spec = ServeApplicationSpec.model_validate(application["spec"])
    assert application["spec"]["instance"] == "default"
    assert spec.import_path == "examples.hello:app"


def test_operator_holds_every_permission_it_grants_to_the_data_plane() -> None:
    """RBAC lets the operator create a Role only with rules it holds itself (no escalate verb)."""
    render_proxy = pytest.importorskip("kubeserve.backends.kubernetes.render_proxy")
    granted = rules_of({"rules": render_proxy.DATAPLANE_RULES + render_proxy.BUILD_RULES})
    assert granted
    assert granted <= OPERATOR_NAMESPACED_RULES


def test_image_user_is_the_uid_every_pod_runs_as() -> None:
    """runAsNonRoot needs a numeric non-root USER in the image; every pod pins the same UID."""
    render_pod = pytest.importorskip("kubeserve.backends.kubernetes.render_pod")
    dockerfile = (MANIFESTS.parent / "Dockerfile").read_text()
    uid = render_pod.POD_UID
    assert uid != 0
    assert f"USER {uid}:{uid}" in dockerfile
    assert f"useradd --uid {uid}" in dockerfile
    security = operator_container(plain_manifests())["securityContext"]
    assert security["runAsUser"] == uid
