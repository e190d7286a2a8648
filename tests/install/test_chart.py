"""The Helm chart, with Helm 3 and Helm 4: lints, renders valid objects, matches manifests/."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeserve.cli import operator as operator_cli
from kubeserve.control.leader_election import LeaseTiming
from kubeserve.schema.config import DEFAULT_DATA_PATH
from support.kubeserve_install import (
    CHART,
    K8S_VERSIONS,
    LEADER_ELECTION_RULES,
    NAMESPACE,
    OPERATOR_CLUSTER_RULES,
    OPERATOR_NAMESPACED_RULES,
    find,
    helm_template,
    one,
    operator_container,
    plain_manifests,
    rendered_chart,
    rules_of,
    validate,
)

WATCHED = {"watchNamespaces": ["team-a", "team-b"]}
METRICS = {
    "metrics": {
        "enabled": True,
        "port": 9090,
        "serviceMonitor": {"enabled": True},
        "podMonitors": [{"namespace": "apps"}, {"namespace": "ml", "instance": "gpu"}],
        "grafanaDashboard": {"enabled": True},
    }
}
#: Values that exercise every optional template branch.
EVERYTHING = {
    **WATCHED,
    **METRICS,
    "image": {
        "repository": "registry.example/kubeserve",
        "tag": "0.1.0-rc1",
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "pull"}],
    "serviceAccount": {
        "create": True,
        "name": "ops",
        "annotations": {"example.com/role": "operator"},
    },
    "podAnnotations": {"example.com/owner": "serving"},
    "podLabels": {"team": "serving"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                ]
            }
        }
    },
    "admin": {
        "port": 8265,
        "service": {
            "type": "NodePort",
            "port": 80,
            "annotations": {"example.com/expose": "internal"},
        },
    },
    "logLevel": "DEBUG",
    "replicaCount": 3,
    "leaderElection": {"flowSchema": {"priorityLevel": "workload-high", "matchingPrecedence": 500}},
}
ELECTION_ROLE = "kubeserve-operator-leader-election"
VALUE_SETS = {"default": {}, "watchNamespaces": WATCHED, "everything": EVERYTHING}


def _flag(container: dict[str, Any], name: str) -> str | None:
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in container["args"] if a.startswith(prefix)), None)


def _lint(helm: str, values: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    command = [
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(values_file),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict(any_helm: str, values: dict[str, Any], tmp_path: Path) -> None:
    result = _lint(any_helm, values, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_validates_strictly(any_helm: str, values: dict[str, Any]) -> None:
    objects = rendered_chart(values, helm=any_helm)
    for version in K8S_VERSIONS:
        for obj in objects:
            if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
                continue  # prometheus-operator CRDs: no Kubernetes schema to check them against
            validate(obj, version)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm3_and_helm4_render_the_same(helm: str, values: dict[str, Any]) -> None:
    from support.kubeserve_install import find_helm3

    helm3 = find_helm3()
    if helm3 is None:
        pytest.skip("no helm3 binary: run `make helm`")
    assert rendered_chart(values, helm=helm3) == rendered_chart(values, helm=helm)


def test_default_install_is_the_plain_manifests_with_helm_labels(helm: str) -> None:
    """Same objects, names, RBAC, container and Service as manifests/ (bar labels and namespace)."""
    chart = rendered_chart({}, helm=helm)
    plain = [o for o in plain_manifests() if o["kind"] != "Namespace"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in chart) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in plain
    )
    assert rules_of(one(chart, "ClusterRole")) == rules_of(one(plain, "ClusterRole"))
    for kind in ("Role", "PodDisruptionBudget"):
        assert one(chart, kind).get("rules") == one(plain, kind).get("rules"), kind
        assert one(chart, kind).get("spec") == one(plain, kind).get("spec"), kind
    assert (
        one(chart, "ClusterRoleBinding")["subjects"] == one(plain, "ClusterRoleBinding")["subjects"]
    )
    ours, theirs = operator_container(chart), operator_container(plain)
    for key in ("image", "command", "args", "env", "ports", "resources", "securityContext"):
        assert ours[key] == theirs[key], key
    for key in ("readinessProbe", "livenessProbe"):
        assert ours[key] == theirs[key], key
    chart_pod = one(chart, "Deployment")["spec"]["template"]["spec"]
    plain_pod = one(plain, "Deployment")["spec"]["template"]["spec"]
    for key in ("securityContext", "volumes", "serviceAccountName", "affinity"):
        assert chart_pod[key] == plain_pod[key], key
    assert one(chart, "Service")["spec"] == one(plain, "Service")["spec"]
    assert one(chart, "FlowSchema")["spec"] == one(plain, "FlowSchema")["spec"]
    # same selector: the two installs select the same pods (a Deployment's selector is immutable)
    assert (
        one(chart, "Deployment")["spec"]["strategy"] == one(plain, "Deployment")["spec"]["strategy"]
    )
    assert (
        one(chart, "Deployment")["spec"]["replicas"] == one(plain, "Deployment")["spec"]["replicas"]
    )
    chart_selector = one(chart, "Deployment")["spec"]["selector"]
    assert chart_selector == one(plain, "Deployment")["spec"]["selector"]


def test_crds_render_with_include_crds_and_not_without(helm: str) -> None:
    with_crds = find(rendered_chart({}, helm=helm), "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in with_crds} == {
        "serveinstances.kubeserve.io",
        "serveapplications.kubeserve.io",
    }
    without = rendered_chart({}, helm=helm, include_crds=False)
    assert not find(without, "CustomResourceDefinition")


def test_cluster_wide_by_default(helm: str) -> None:
    objects = rendered_chart({}, helm=helm)
    assert (
        rules_of(one(objects, "ClusterRole")) == OPERATOR_NAMESPACED_RULES | OPERATOR_CLUSTER_RULES
    )
    # namespaced grants: only leader election's, in the release namespace
    assert [r["metadata"]["name"] for r in find(objects, "Role")] == [ELECTION_ROLE]
    assert [b["metadata"]["name"] for b in find(objects, "RoleBinding")] == [ELECTION_ROLE]
    assert _flag(operator_container(objects), "watch-namespaces") == ""


def test_watch_namespaces_grant_roles_per_namespace_only(helm: str) -> None:
    objects = rendered_chart(WATCHED, helm=helm)
    watched = ["team-a", "team-b", NAMESPACE]  # the admin API writes into the release namespace
    assert _flag(operator_container(objects), "watch-namespaces") == ",".join(watched)
    cluster_role = one(objects, "ClusterRole")
    assert rules_of(cluster_role) == OPERATOR_CLUSTER_RULES  # kopf lists no namespaces
    roles = [r for r in find(objects, "Role") if r["metadata"]["name"] != ELECTION_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(watched)
    for role in roles:
        assert rules_of(role) == OPERATOR_NAMESPACED_RULES
    bindings = [b for b in find(objects, "RoleBinding") if b["metadata"]["name"] != ELECTION_ROLE]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(watched)
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "kubeserve-operator",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kubeserve-operator", "namespace": NAMESPACE}
        ]


def test_release_namespace_is_not_listed_twice(helm: str) -> None:
    objects = rendered_chart({"watchNamespaces": ["team-a", NAMESPACE]}, helm=helm)
    assert _flag(operator_container(objects), "watch-namespaces") == f"team-a,{NAMESPACE}"
    assert len(find(objects, "Role")) == 3  # one per watched namespace, and leader election's


def test_metrics_port_and_service_monitor(helm: str) -> None:
    objects = rendered_chart(METRICS, helm=helm)
    container = operator_container(objects)
    assert _flag(container, "metrics-port") == "9090"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    service = one(objects, "Service")
    assert {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"} in service[
        "spec"
    ]["ports"]
    monitor = one(objects, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_pod_monitors_scrape_the_serving_pods_with_their_instances_token(helm: str) -> None:
    monitors = find(rendered_chart(METRICS, helm=helm), "PodMonitor")
    assert [(m["metadata"]["namespace"], m["metadata"]["name"]) for m in monitors] == [
        ("apps", "kubeserve-default"),
        ("ml", "kubeserve-gpu"),
    ]
    (endpoint,) = monitors[1]["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    token = endpoint["authorization"]["credentials"]
    assert token == {"name": "gpu-metrics-token", "key": "token"}
    selector = monitors[1]["spec"]["selector"]
    assert selector["matchLabels"]["kubeserve.io/instance"] == "gpu"


def test_grafana_dashboard_reads_rays_metric_names(helm: str) -> None:
    (config_map,) = [
        o for o in find(rendered_chart(METRICS, helm=helm), "ConfigMap") if "grafana" in str(o)
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["kubeserve-serve.json"])
    queries = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for name in (
        "ray_serve_num_http_requests_total",
        "ray_serve_http_request_latency_ms_bucket",
        "ray_serve_deployment_processing_latency_ms_bucket",
        "ray_serve_replica_processing_queries",
    ):
        assert name in queries


def test_metrics_off_by_default(helm: str) -> None:
    objects = rendered_chart({}, helm=helm)
    assert _flag(operator_container(objects), "metrics-port") is None
    assert not find(objects, "ServiceMonitor")
    assert not find(objects, "PodMonitor")


def test_values_reach_the_pod(helm: str) -> None:
    objects = rendered_chart(EVERYTHING, helm=helm)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    container = operator_container(objects)
    assert container["image"] == "registry.example/kubeserve:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert _flag(container, "log-level") == "DEBUG"
    assert pod["spec"]["serviceAccountName"] == "ops"
    assert one(objects, "ServiceAccount")["metadata"]["name"] == "ops"
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets", "priorityClassName"):
        assert pod["spec"][key] == EVERYTHING[key], key
    assert pod["metadata"]["annotations"] == {"example.com/owner": "serving"}
    assert pod["metadata"]["labels"]["team"] == "serving"
    service = one(objects, "Service")
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"][0]["port"] == 80
    # selectors never depend on values that may change across upgrades (immutable selector)
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]


def test_release_name_and_namespace_follow_the_release(helm: str) -> None:
    objects = rendered_chart({}, helm=helm, release="serving", namespace="ops")
    assert one(objects, "Deployment")["metadata"] == {
        **one(objects, "Deployment")["metadata"],
        "name": "serving-kubeserve-operator",
        "namespace": "ops",
    }
    assert one(objects, "Service", "serving-kubeserve-admin")
    assert one(objects, "ClusterRoleBinding")["subjects"][0]["namespace"] == "ops"
    # the Lease the replicas elect on is the one their Role lets them renew
    lease = _flag(operator_container(objects), "leader-election-lease")
    role = one(objects, "Role", "serving-kubeserve-operator-leader-election")
    assert role["metadata"]["namespace"] == "ops"
    assert [lease] == role["rules"][1]["resourceNames"]


def test_leader_election_timing_reaches_the_operator_flags(helm: str) -> None:
    """The chart's timing values become the operator's flags, which its own parser reads as
    they were meant (a slow API server wants longer ones)."""
    timing = {"leaseDuration": 30, "renewDeadline": 20, "retryPeriod": 2.5}
    container = operator_container(rendered_chart({"leaderElection": timing}, helm=helm))
    parser = argparse.ArgumentParser()
    operator_cli.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    assert (
        args.leader_election_lease_duration,
        args.leader_election_renew_deadline,
        args.leader_election_retry_period,
    ) == (30.0, 20.0, 2.5)
    # the defaults are the operator's own
    default = parser.parse_args(operator_container(rendered_chart({}, helm=helm))["args"][1:])
    assert (
        default.leader_election_lease_duration,
        default.leader_election_renew_deadline,
        default.leader_election_retry_period,
    ) == (LeaseTiming.lease_duration_s, LeaseTiming.renew_deadline_s, LeaseTiming.retry_period_s)


def test_proxy_data_path_reaches_the_operator_flag(helm: str) -> None:
    """``proxyDataPath``: the operator's default data path for instances that do not choose one;
    empty (the chart's default) leaves the operator's own default, the one constant."""
    parser = argparse.ArgumentParser()
    operator_cli.add_arguments(parser)
    container = operator_container(rendered_chart({"proxyDataPath": "python"}, helm=helm))
    assert parser.parse_args(container["args"][1:]).proxy_data_path == "python"
    container = operator_container(rendered_chart({}, helm=helm))
    assert _flag(container, "proxy-data-path") is None
    assert parser.parse_args(container["args"][1:]).proxy_data_path == DEFAULT_DATA_PATH.value
    assert DEFAULT_DATA_PATH.value == "native"


def test_node_local_sockets_reaches_the_operator_flag(helm: str) -> None:
    """``nodeLocalSockets``: Auto (the default) or Off, the operator's choice for instances that
    leave ``spec.proxy.nodeLocalSockets`` unset; the schema refuses anything else, naming it."""
    parser = argparse.ArgumentParser()
    operator_cli.add_arguments(parser)
    container = operator_container(rendered_chart({}, helm=helm))
    assert parser.parse_args(container["args"][1:]).node_local_sockets == "auto"
    container = operator_container(rendered_chart({"nodeLocalSockets": "Off"}, helm=helm))
    assert parser.parse_args(container["args"][1:]).node_local_sockets == "off"
    with pytest.raises(RuntimeError, match="nodeLocalSockets"):
        rendered_chart({"nodeLocalSockets": "Always"}, helm=helm)


def test_replicas_elect_a_leader_and_roll_one_at_a_time(helm: str) -> None:
    """Two replicas by default: each serves the admin API (readiness is the API answering), the
    one holding the Lease reconciles; neither a roll nor a drain takes both at once."""
    objects = rendered_chart({}, helm=helm)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    container = operator_container(objects)
    assert _flag(container, "leader-election-lease") == "kubeserve-operator"
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/healthz", "port": "admin"}
    assert {
        "name": "KUBESERVE_POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    } in container["env"]
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    role = one(objects, "Role", "kubeserve-operator-leader-election")
    assert rules_of(role) == LEADER_ELECTION_RULES
    assert role["rules"][1]["resourceNames"] == ["kubeserve-operator"]
    binding = one(objects, "RoleBinding", "kubeserve-operator-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert (
        binding["subjects"][0]["name"]
        == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    )


def test_lease_requests_have_a_flow_schema_of_their_own(helm: str) -> None:
    """The operator's Lease requests (and nothing else) go to the built-in leader-election
    priority level, not to workload-low behind the operator's own traffic; off by a value."""
    objects = rendered_chart({}, helm=helm, release="serving", namespace="ops")
    schema = one(objects, "FlowSchema")
    assert schema["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert schema["metadata"]["name"] == "serving-kubeserve-operator-leader-election"
    spec = schema["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert 1 < spec["matchingPrecedence"] < 9000  # before the service accounts' (9000)
    account = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    [rule] = spec["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": "ops"}}
    ]
    assert rule["resourceRules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update", "patch"],  # every verb the elector sends
            "namespaces": ["ops"],
        }
    ]
    assert "nonResourceRules" not in rule
    # the Lease it covers is the one the replicas elect on
    role = one(objects, "Role", "serving-kubeserve-operator-leader-election")
    assert role["metadata"]["namespace"] == "ops"
    chosen = rendered_chart(
        {"leaderElection": {"flowSchema": {"priorityLevel": "workload-high"}}}, helm=helm
    )
    assert one(chosen, "FlowSchema")["spec"]["priorityLevelConfiguration"]["name"] == (
        "workload-high"
    )
    off = rendered_chart({"leaderElection": {"flowSchema": {"enabled": False}}}, helm=helm)
    assert not find(off, "FlowSchema")


def test_one_replica_has_no_disruption_budget(helm: str) -> None:
    """A budget of one pod that may not go would block every drain of its node."""
    objects = rendered_chart({"replicaCount": 1}, helm=helm)
    assert one(objects, "Deployment")["spec"]["replicas"] == 1
    assert not find(objects, "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"admin": {"port": 70000}}, "port"),
        ({"replicas": 3}, "replicas"),
        ({"replicaCount": 0}, "replicaCount"),
        ({"leaderElection": {"retryPeriod": 0}}, "retryPeriod"),
        ({"leaderElection": {"flowSchema": {"matchingPrecedence": 0}}}, "matchingPrecedence"),
        ({"leaderElection": {"flowSchema": {"priorityLevel": "Not A Name"}}}, "priorityLevel"),
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, "metrics.enabled"),
        ({"proxyDataPath": "turbo"}, "proxyDataPath"),
    ],
    ids=[
        "pull-policy",
        "namespace-name",
        "port",
        "unknown-value",
        "no-replica",
        "no-retry-period",
        "flow-schema-precedence",
        "flow-schema-priority-level",
        "monitor-without-metrics",
        "data-path",
    ],
)
def test_bad_values_are_refused(any_helm: str, values: dict[str, Any], message: str) -> None:
    result = helm_template(values, helm=any_helm)
    assert result.returncode != 0
    assert message in result.stderr


def test_notes_say_how_to_reach_the_admin_api(helm: str) -> None:
    result = subprocess.run(
        [helm, "install", "kubeserve", str(CHART), "--dry-run=client", "-n", NAMESPACE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0 and "cluster" in result.stderr.lower():
        pytest.skip(f"helm install --dry-run=client needs no cluster here: {result.stderr}")
    assert result.returncode == 0, result.stderr
    assert "port-forward svc/kubeserve-admin 8265" in result.stdout
    assert "every namespace" in result.stdout
