"""What kubeserve installs, as objects: the rendered Helm chart and the plain manifests.

Reusable by other test tiers (the control-plane tests apply these to a real API server):

    from support.kubeserve_install import rendered_chart, plain_manifests

Helm comes from the Makefile: ``KUBESERVE_HELM`` (Helm 4) and ``KUBESERVE_HELM3`` (Helm 3) name the
binaries ``make helm`` extracted. Without them, the newest cached binary of that major version under
``~/.cache/kubeserve/helm`` is used; a variable that is set must name an existing file.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeserve"
MANIFESTS = REPO / "manifests"
CRDS = REPO / "crds"
RELEASE = "kubeserve"
NAMESPACE = "kubeserve-system"
HELM_CACHE = Path.home() / ".cache" / "kubeserve" / "helm"

#: Kubernetes versions every installed object must validate against (strict: no unknown fields): the
#: test control plane's (Makefile K8S_VERSION) and the newest that kubernetes-validate knows.
K8S_VERSIONS = tuple(dict.fromkeys(("1.36.0", kubernetes_validate.latest_version())))


def _find(variable: str, major: str) -> str | None:
    configured = os.environ.get(variable)
    if configured:
        if not Path(configured).is_file():
            raise FileNotFoundError(f"{variable}={configured} does not exist: run `make helm`")
        return configured
    cached = sorted(HELM_CACHE.glob(f"v{major}.*/helm"))
    return str(cached[-1]) if cached else None


def find_helm() -> str | None:
    """The Helm 4 binary, or None when there is none (outside ``make test``)."""
    return _find("KUBESERVE_HELM", "4")


def find_helm3() -> str | None:
    """The Helm 3 binary, or None when there is none."""
    return _find("KUBESERVE_HELM3", "3")


def helm_template(
    values: dict[str, Any],
    *,
    helm: str | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    include_crds: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``helm template`` of the chart with ``values``; the caller checks the return code."""
    binary = helm or find_helm()
    if binary is None:
        raise FileNotFoundError("no helm binary: run `make helm`")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        yaml.safe_dump(values, values_file)
        values_file.flush()
        command = [binary, "template", release, str(CHART), "--namespace", namespace]
        command += ["--values", values_file.name]
        if include_crds:
            command.append("--include-crds")
        return subprocess.run(command, capture_output=True, text=True, timeout=60)


def rendered_chart(
    values: dict[str, Any],
    *,
    helm: str | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    include_crds: bool = True,
) -> list[dict[str, Any]]:
    """The chart rendered with ``values`` (over values.yaml): every object, CRDs first.

    Raises ``RuntimeError`` with Helm's message when the chart does not render (for example when
    the values break values.schema.json).
    """
    result = helm_template(
        values, helm=helm, namespace=namespace, release=release, include_crds=include_crds
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def manifest_files() -> list[Path]:
    """The plain manifests in the order ``kubectl apply -f manifests/`` applies them."""
    return sorted(MANIFESTS.glob("*.yaml"))


def plain_manifests() -> list[dict[str, Any]]:
    """Every object of ``manifests/``, in apply order."""
    objects: list[dict[str, Any]] = []
    for path in manifest_files():
        objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return objects


def validate(obj: dict[str, Any], version: str) -> None:
    """Validate ``obj`` against the Kubernetes ``version`` schemas; unknown fields are errors."""
    kubernetes_validate.validate(obj, version, strict=True)


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "operator")


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """A role's rules flattened to (apiGroup, resource, verb) triples, for set comparisons."""
    return {
        (group, resource, verb)
        for rule in role.get("rules", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def _triples(group: str, resources: str, verbs: str) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources.split() for v in verbs.split()}


#: Everything the operator may do in a namespace it watches, and nothing more: its custom resources,
#: their status and finalizers; the children it renders; the data-plane Secret (get, create only);
#: pod and EndpointSlice reads; the data-plane
#: ServiceAccount, Role and RoleBinding it creates per namespace; Events.
OPERATOR_NAMESPACED_RULES = (
    _triples(
        "kubeserve.io",
        "serveinstances serveapplications",
        "get list watch create update patch delete",
    )
    | _triples("kubeserve.io", "serveinstances/status serveapplications/status", "get update patch")
    | _triples("kubeserve.io", "serveinstances/finalizers serveapplications/finalizers", "update")
    | _triples("apps", "deployments daemonsets", "get list watch create update patch delete")
    | _triples("", "services configmaps", "get list watch create update patch delete")
    | _triples("batch", "jobs", "get list watch create patch delete")
    | _triples("networking.k8s.io", "networkpolicies", "get list watch create patch delete")
    | _triples("policy", "poddisruptionbudgets", "get list watch create patch delete")
    | _triples("", "secrets", "get create")
    | _triples("", "pods", "get list watch create")
    | _triples("", "serviceaccounts", "get list watch create patch")
    | _triples("rbac.authorization.k8s.io", "roles rolebindings", "get list watch create patch")
    | _triples("discovery.k8s.io", "endpointslices", "get list watch")
    | _triples("", "events", "create patch")
    | _triples("events.k8s.io", "events", "create patch")
)
#: Cluster-scoped reads kopf needs in every mode, and the admin API's reviews of its callers.
OPERATOR_CLUSTER_RULES = (
    _triples("apiextensions.k8s.io", "customresourcedefinitions", "get list watch")
    | _triples("authentication.k8s.io", "tokenreviews", "create")
    | _triples("authorization.k8s.io", "subjectaccessreviews", "create")
)
#: The operator's replicas elect their leader on one Lease in the release namespace.
LEADER_ELECTION_RULES = _triples("coordination.k8s.io", "leases", "create get update patch")
