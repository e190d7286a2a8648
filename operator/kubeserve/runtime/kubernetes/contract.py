"""The contract between the operator and the processes in its pods, spelled once.

The operator (:mod:`kubeserve.backends.kubernetes`) writes objects, labels and environment
variables; proxies, replicas and build Jobs (:mod:`kubeserve.runtime.kubernetes`) read them. Both
import every name, label, annotation, environment variable, port and key from here, so neither can
drift from the other. The module imports nothing else from kubeserve and no Kubernetes client, so
every data-plane process (a replica on one machine too) can load it for free.

:data:`GROUP`, :data:`VERSION` and :data:`DEFAULT_INSTANCE` are also declared by
:mod:`kubeserve.schema.resources`, the bottom layer that generates the CRDs from them and cannot
import this module (a test pins the two equal); the data plane never loads the schema.

Names are pure functions of the custom resources' names. Invariants:

* every name returned is a DNS-1035 label (lowercase alphanumerics and ``-``, starting with a
  letter, at most 63 characters), valid for a Service, a Job (whose name becomes a label value) and
  every other kind kubeserve creates;
* a name is the readable composition of its parts (``<app>-<deployment>``) when that composition
  is valid and unambiguous; otherwise it is shortened or cleaned and ends in ``-<8 hex>``, a digest
  of the *parts*, so distinct inputs do not collide (``("a-b", "c")`` and ``("a", "b-c")`` differ);
* names and labels depend only on the custom resources' names, never on their specs, so no spec
  change can rename an object (a Deployment's selector is immutable).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, TypedDict, cast

__all__ = [
    "ACCESS_LOG_DIR",
    "ACCESS_LOG_FILE",
    "API_VERSION",
    "APPLICATION_ENV",
    "APPLICATION_LABEL",
    "APPLICATION_NAME_ANNOTATION",
    "BIND_HOST",
    "BIND_HOST_ENV",
    "COMPONENT_BUILD",
    "COMPONENT_LABEL",
    "COMPONENT_PICKLED_GRAPH",
    "COMPONENT_POLICY",
    "COMPONENT_PROXY",
    "COMPONENT_REPLICA",
    "DATA_PLANE_SECRET_KEY",
    "DEFAULT_INSTANCE",
    "DEPLOYMENT_LABEL",
    "DEPLOYMENT_NAME_ANNOTATION",
    "DISCOVERY_ENV",
    "DISCOVERY_KUBERNETES",
    "EXTERNAL_REPLICAS_ANNOTATION",
    "GRAPH_KEY",
    "GROUP",
    "INSTANCE_ENV",
    "INSTANCE_LABEL",
    "KUBERNETES_NAMESPACE_LABEL",
    "MANAGED_BY_LABEL",
    "MANAGED_SELECTOR",
    "MAX_NAME_LENGTH",
    "METRICS_PORT",
    "METRICS_PORT_ENV",
    "METRICS_TOKEN_KEY",
    "NAMESPACE_ENV",
    "NAME_LABEL",
    "NODE_SOCKETS_DIR",
    "NODE_SOCKETS_HOST_ROOT",
    "OPERATOR_POD_LABELS",
    "PICKLED_GRAPH_DIR",
    "PICKLED_GRAPH_KEY",
    "POD_IP_ENV",
    "POD_NAME_ENV",
    "POLICY_PORT",
    "PROBE_PORT",
    "PRODUCT",
    "PROXY_DRAIN_S",
    "PROXY_GRACE_S",
    "PROXY_LEAVE_DELAY_S",
    "PROXY_REPLACEMENT_WAIT_S",
    "REPLICA_PORT",
    "SCRAPE_ANNOTATIONS",
    "SERVICE_NAME_LABEL",
    "VERSION",
    "VERSION_ANNOTATION",
    "ApplicationStatusEntry",
    "DeploymentStatusEntry",
    "OwnerReference",
    "application_cr_name",
    "application_name",
    "application_status",
    "build_account_name",
    "build_job_name",
    "common_labels",
    "dataplane_account_name",
    "dataplane_secret_name",
    "graph_configmap_name",
    "instance_of",
    "label_value",
    "metrics_token_secret_name",
    "network_policy_name",
    "node_sockets_host_path",
    "owner_reference",
    "pickled_graph_secret_name",
    "policy_workload_name",
    "proxy_name",
    "selector_labels",
    "shared_build_name",
    "workload_name",
]

# --------------------------------------------------------------------------- custom resources

GROUP = "kubeserve.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
#: The ``ServeInstance`` an application belongs to when ``spec.instance`` is unset.
DEFAULT_INSTANCE = "default"

# --------------------------------------------------------------------------- labels

PRODUCT = "kubeserve"
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "kubeserve.io/instance"
APPLICATION_LABEL = "kubeserve.io/application"
DEPLOYMENT_LABEL = "kubeserve.io/deployment"
#: Selects every child object kubeserve manages (the EndpointSlice controller copies a Service's
#: labels onto its slices, so it selects replica endpoints too).
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={PRODUCT}"
#: Set by the EndpointSlice controller on every slice: the name of its Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: Set by the API server on every namespace: its name.
KUBERNETES_NAMESPACE_LABEL = "kubernetes.io/metadata.name"

#: Labels every operator pod carries (the install manifests and the Helm chart set them); the
#: replicas' NetworkPolicy admits the operator's pods by them (it pushes user_config).
OPERATOR_POD_LABELS = {
    "app.kubernetes.io/part-of": PRODUCT,
    COMPONENT_LABEL: "operator",
}

COMPONENT_PROXY = "proxy"
COMPONENT_REPLICA = "replica"
COMPONENT_BUILD = "build"
#: the pod answering an application's custom autoscaling policies (``kubeserve policy-host``)
COMPONENT_POLICY = "autoscaling-policy"
#: the Secret holding an imperative application's pickled graph
COMPONENT_PICKLED_GRAPH = "pickled-graph"

#: On a replica workload and its pods: :func:`kubeserve.control.effective_config.replica_version`.
VERSION_ANNOTATION = "kubeserve.io/replica-version"
#: The exact (unshortened) Ray application and deployment names, for people and tools.
APPLICATION_NAME_ANNOTATION = "kubeserve.io/application-name"
DEPLOYMENT_NAME_ANNOTATION = "kubeserve.io/deployment-name"
#: On a ``ServeApplication``: JSON ``{deployment: replicas}`` set through the external scaling
#: API (``external_scaler_enabled``); the operator renders those counts. Not part of the spec, so
#: a PUT of the same config keeps them, as Ray keeps an externally set count.
EXTERNAL_REPLICAS_ANNOTATION = "kubeserve.io/external-target-replicas"

#: The key of the data-plane Secret (:func:`dataplane_secret_name`) holding the secret (hex).
DATA_PLANE_SECRET_KEY = "secret"
#: The key of the build's ConfigMap (:func:`graph_configmap_name`) holding its JSON document: the
#: graph (``kubeserve build``'s output), or ``{"error": ...}``.
GRAPH_KEY = "graph.json"
#: The key of an imperative application's graph Secret (:func:`pickled_graph_secret_name`): the
#: graph its driver's ``serve.run`` pickled, as sent.
PICKLED_GRAPH_KEY = "graph.pickle"
#: Where build and replica pods of an imperative application find that Secret mounted.
PICKLED_GRAPH_DIR = "/var/run/kubeserve/pickled-graph"

# --------------------------------------------------------------------------- pods

#: The replica's port (user traffic and handle calls, behind the data-plane handshake).
REPLICA_PORT = 8000
#: The policy host's port (behind the data-plane handshake, ``CONTROL`` connections only).
POLICY_PORT = 8000
#: The replica's unauthenticated health listener (container port ``probe``), for the kubelet.
PROBE_PORT = 8081
#: How long a replica pod keeps taking requests after the kubelet's SIGTERM, before it drains:
#: the pod leaves its EndpointSlice as the kubelet signals it, and proxies and handles learn it
#: from their watch some time later; within this, they stop choosing it while it still serves.
REPLICA_LEAVE_DELAY_S = 2.0
#: What a replica pod's grace period adds to its ``graceful_shutdown_timeout_s``: the leave
#: delay, and the time it gives callers to drop their connections once drained.
REPLICA_GRACE_EXTRA_S = REPLICA_LEAVE_DELAY_S + 1.0
#: How a proxy pod leaves after the kubelet's SIGTERM
#: (:class:`~kubeserve.runtime.proxy.server.LeavePlan`): it serves on until another proxy pod of
#: its Service is ready (at most this long: the replacement of a ``HeadOnly`` proxy starts as the
#: old one terminates), then while kube-proxy drops it, then closes its keep-alive connections
#: gracefully, letting requests in flight finish; the pod's grace period covers the three. (The
#: wait is long enough for a replacement's image to be pulled on another node; a DaemonSet's
#: replacement on the same node starts only once the old pod is gone, but with proxies on other
#: nodes the wait ends at once.)
PROXY_REPLACEMENT_WAIT_S = 60.0
PROXY_LEAVE_DELAY_S = 2.0
PROXY_DRAIN_S = 8.0
PROXY_GRACE_S = int(PROXY_REPLACEMENT_WAIT_S + PROXY_LEAVE_DELAY_S + PROXY_DRAIN_S) + 5
#: Prometheus metrics of a proxy or replica pod (container port ``metrics``; a bearer token,
#: see :mod:`kubeserve.runtime.metrics_listener`), and the variable that turns it on.
METRICS_PORT = 8082
METRICS_PORT_ENV = "KUBESERVE_METRICS_PORT"
#: The key of the metrics token in the Secret :func:`metrics_token_secret_name`.
METRICS_TOKEN_KEY = "token"
#: The annotations of proxy and replica pods that tell Prometheus where their metrics are.
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(METRICS_PORT),
    "prometheus.io/path": "/metrics",
}

POD_IP_ENV = "KUBESERVE_POD_IP"
#: The address kubeserve's servers bind to: every address of the pod, so probes, Services and
#: ``kubectl port-forward`` (which connects to 127.0.0.1 inside the pod) all reach it.
BIND_HOST_ENV = "KUBESERVE_BIND_HOST"
BIND_HOST = "0.0.0.0"
POD_NAME_ENV = "KUBESERVE_POD_NAME"
#: ``ServeInstance.spec.proxy.nodeLocalSockets``: where proxy and replica pods mount the node's
#: directory of replica sockets (:mod:`kubeserve.runtime.local_socket`; short: a socket path
#: has at most 107 bytes).
NODE_SOCKETS_DIR = "/var/run/kubeserve/node"
#: Where proxy and replica pods write their access lines (``spec.logs.accessLines: File``): a
#: rotated file (``access.log``, ``access.log.1``...) in an ``emptyDir`` mounted here.
ACCESS_LOG_DIR = "/var/log/kubeserve"
ACCESS_LOG_FILE = f"{ACCESS_LOG_DIR}/access.log"
#: The node's directories of replica sockets, one per instance under it (a ``hostPath``).
NODE_SOCKETS_HOST_ROOT = "/run/kubeserve"
#: Where a pod's process finds its custom resources (``metadata.namespace``).
NAMESPACE_ENV = "KUBESERVE_NAMESPACE"
#: The ``ServeInstance`` a process belongs to (proxies serve only its applications' routes).
INSTANCE_ENV = "KUBESERVE_INSTANCE"
#: The ``ServeApplication`` object a replica reads its ``user_config`` from at start-up.
APPLICATION_ENV = "KUBESERVE_APPLICATION"
#: :data:`DISCOVERY_KUBERNETES` in a replica: discover replicas from EndpointSlices and CR status,
#: not a controller URL (a proxy is told so by ``--discovery kubernetes``).
DISCOVERY_ENV = "KUBESERVE_DISCOVERY"
DISCOVERY_KUBERNETES = "kubernetes"

MAX_NAME_LENGTH = 63
_HASH_LENGTH = 8
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_HEX_SUFFIX = re.compile(rf"[0-9a-f]{{{_HASH_LENGTH}}}")


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool
    blockOwnerDeletion: bool


# --------------------------------------------------------------------------- application status


class DeploymentStatusEntry(TypedDict, total=False):
    """One deployment in ``ServeApplication.status.deployments``, as the operator writes it.

    The operator writes it through :class:`kubeserve.schema.resources.DeploymentStatusEntry`; the
    keys are that model's aliases (a test pins them). Every key may be absent.
    """

    status: str
    statusTrigger: str
    message: str
    replicas: int
    readyReplicas: int
    targetReplicas: int
    #: the Service whose EndpointSlices list the ready replicas
    service: str | None
    maxOngoingRequests: int | None
    maxQueuedRequests: int | None
    backpressureStatus: int | None
    retryAfterS: float | None
    #: the custom request router's spec as JSON (absent: the built-in router)
    requestRouter: str | None
    lastScalingDecision: dict[str, Any] | None


class ApplicationStatusEntry(TypedDict, total=False):
    """``ServeApplication.status`` as the data plane reads it (the keys of
    :class:`kubeserve.schema.resources.ServeApplicationStatus`; a test pins them)."""

    appStatus: str | None
    message: str
    readyDeployments: str | None
    replicas: str | None
    routePrefix: str | None
    ingressDeployment: str | None
    docsPath: str | None
    lastDeployedTime: str | None
    observedGeneration: int | None
    deployments: dict[str, DeploymentStatusEntry]
    conditions: list[dict[str, Any]]
    kopf: dict[str, Any] | None


def application_status(obj: Mapping[str, Any]) -> ApplicationStatusEntry:
    """The status the operator wrote on a ``ServeApplication`` (empty before its first pass)."""
    status = obj.get("status")
    return cast(ApplicationStatusEntry, status if isinstance(status, dict) else {})


def instance_of(obj: Mapping[str, Any]) -> str:
    """The ``ServeInstance`` a ``ServeApplication`` belongs to (:data:`DEFAULT_INSTANCE` unless
    ``spec.instance`` names another)."""
    return str((obj.get("spec") or {}).get("instance", DEFAULT_INSTANCE))


# --------------------------------------------------------------------------- application names


def application_name(obj: Mapping[str, Any]) -> str:
    """The Ray name of a ``ServeApplication``: ``spec.appName``, else the object's name.

    Ray's single-application family names its application ``""`` (the PUT body's default), which
    ``spec.appName`` cannot hold (it must not be empty): the admin API leaves ``appName`` unset and
    marks the object with an empty :data:`APPLICATION_NAME_ANNOTATION` instead. The operator, the
    data plane (routes, handle keys, the replica's config) and the admin API's GET all read the
    name here, so they agree on it.
    """
    meta = obj["metadata"]
    if (meta.get("annotations") or {}).get(APPLICATION_NAME_ANNOTATION) == "":
        return ""
    return str((obj.get("spec") or {}).get("appName") or meta["name"])


def application_cr_name(name: str) -> str:
    """The ``ServeApplication`` object name the admin API gives a Ray application name.

    The name itself when it is a DNS-1123 label; else its lowercase alphanumerics joined by ``-``
    and ``-<8 hex>`` (a digest of the exact name), so distinct Ray names never share an object.
    ``spec.appName`` (or, for ``""``, the annotation) carries the exact Ray name
    (:func:`application_name`).
    """
    if len(name) <= MAX_NAME_LENGTH and _DNS_1123_LABEL.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_LENGTH]
    cleaned = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    head = cleaned[: MAX_NAME_LENGTH - _HASH_LENGTH - 1].strip("-")
    return f"{head}-{digest}" if head else f"app-{digest}"


# --------------------------------------------------------------------------- object names


def _digest(parts: tuple[str, ...]) -> str:
    raw = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:_HASH_LENGTH]


def _hashed(cleaned: str, parts: tuple[str, ...], limit: int) -> str:
    """``cleaned`` cut to fit ``limit`` with ``-<digest of parts>`` appended."""
    suffix = _digest(parts)
    head = cleaned[: limit - len(suffix) - 1].rstrip("-_.")
    return f"{head}-{suffix}" if head else suffix


def _dns_label(parts: tuple[str, ...], *, exact: bool) -> str:
    """``parts`` joined by ``-`` as a DNS-1035 label; ``exact`` says the join is unambiguous."""
    joined = "-".join(parts)
    if exact and len(joined) <= MAX_NAME_LENGTH and _DNS_1035.fullmatch(joined):
        return joined
    cleaned = re.sub(r"[^a-z0-9]+", "-", joined.lower()).strip("-")
    if not cleaned[:1].isalpha():
        cleaned = f"ks-{cleaned}".rstrip("-")
    return _hashed(cleaned, parts, MAX_NAME_LENGTH)


def workload_name(app_cr: str, deployment: str) -> str:
    """Name of the Deployment/DaemonSet and the headless Service of one serve deployment.

    Readable ``<app>-<deployment>`` when valid and when ``deployment`` has no ``-``, does not
    look like a digest and is not ``proxy`` (so the split is unambiguous and never equals a
    :func:`proxy_name`), else the hashed form.
    """
    exact = (
        "-" not in deployment
        and deployment != COMPONENT_PROXY
        and not _HEX_SUFFIX.fullmatch(deployment)
    )
    return _dns_label((app_cr, deployment), exact=exact)


def build_job_name(app_cr: str, build: str | int) -> str:
    """Name of the build Job of one application build (``<app>-build-<build>``)."""
    return _dns_label((app_cr, "build", str(build)), exact="-" not in str(build))


def graph_configmap_name(app_cr: str, build: str | int) -> str:
    """Name of the ConfigMap the build Job writes its graph to (``<app>-graph-<build>``)."""
    return _dns_label((app_cr, "graph", str(build)), exact="-" not in str(build))


def shared_build_name(instance: str, build: str) -> str:
    """Name of the build Job and of the graph ConfigMap it writes, shared by every application of
    ``instance`` whose build inputs digest to ``build`` (``<inst>-build-<build>``; a 16-digit
    digest, so never the name of a per-application :func:`build_job_name` of 10 digits)."""
    return _dns_label((instance, "build", build), exact=True)


def pickled_graph_secret_name(app_cr: str, uid: str, sha256: str) -> str:
    """Name of the Secret holding an imperative application's pickled graph
    (``<app>-pickled-<digest>``): one per graph and incarnation of the ``ServeApplication``
    (``uid``), which owns it, so a graph is never replaced under the pods that mount it and a
    Secret left by a deleted incarnation is never mistaken for the new one's."""
    return _dns_label((app_cr, "pickled", _digest((uid, sha256))), exact=False)


def policy_workload_name(app_cr: str) -> str:
    """Name of the Deployment running an application's policy host
    (``<app>-autoscaling-policy``; a serve deployment's workload never has it, since
    :func:`workload_name` hashes deployment names containing ``-``)."""
    return _dns_label((app_cr, COMPONENT_POLICY), exact=True)


def proxy_name(instance: str) -> str:
    """Name of the proxy Deployment/DaemonSet and Service of a ``ServeInstance``."""
    return _dns_label((instance, "proxy"), exact=True)


def dataplane_account_name(instance: str) -> str:
    """ServiceAccount (and Role, RoleBinding) of an instance's proxy and replica pods."""
    return _dns_label((instance, "dataplane"), exact=True)


def dataplane_secret_name(instance: str) -> str:
    """Secret holding the instance's data-plane secret (the handshake key of
    :mod:`kubeserve.runtime.channel`) under :data:`DATA_PLANE_SECRET_KEY`; created by the operator,
    owned by the ``ServeInstance``, read by its proxy and replica pods."""
    return _dns_label((instance, "dataplane", "secret"), exact=True)


def node_sockets_host_path(namespace: str, instance: str) -> str:
    """The node's directory of the replica sockets of ``instance`` in ``namespace`` (both DNS
    labels, so the path is unambiguous)."""
    return f"{NODE_SOCKETS_HOST_ROOT}/{namespace}/{instance}"


def metrics_token_secret_name(instance: str) -> str:
    """The Secret holding the bearer token Prometheus presents to the instance's metrics ports
    (the data-plane secret itself stays in :func:`dataplane_secret_name`)."""
    return f"{instance}-metrics-token"


def network_policy_name(instance: str, component: str) -> str:
    """NetworkPolicy of an instance's replica (``<inst>-replicas``) or proxy (``<inst>-proxies``)
    pods."""
    plural = {
        COMPONENT_PROXY: "proxies",
        COMPONENT_REPLICA: "replicas",
        COMPONENT_POLICY: "autoscaling-policies",
    }[component]
    return _dns_label((instance, plural), exact=True)


def build_account_name(instance: str) -> str:
    """ServiceAccount (and Role, RoleBinding) of an instance's build Jobs."""
    return _dns_label((instance, "build"), exact=True)


def label_value(value: str) -> str:
    """``value`` as a valid label value: itself when valid, else cleaned, cut and hashed.

    Label values keep case, ``.`` and ``_``, so most names pass unchanged.
    """
    if len(value) <= MAX_NAME_LENGTH and _LABEL_VALUE.fullmatch(value):
        return value
    cleaned = re.sub(r"[^-A-Za-z0-9_.]+", "-", value).strip("-_.")
    return _hashed(cleaned, (value,), MAX_NAME_LENGTH)


def selector_labels(
    component: str,
    *,
    instance: str | None = None,
    application: str | None = None,
    deployment: str | None = None,
) -> dict[str, str]:
    """Labels a workload selects its pods by; built from names only, so they never change.

    Replicas select by application CR and deployment (not by instance, which a spec may change);
    proxies by instance.
    """
    labels = {NAME_LABEL: PRODUCT, COMPONENT_LABEL: component}
    for key, value in (
        (INSTANCE_LABEL, instance),
        (APPLICATION_LABEL, application),
        (DEPLOYMENT_LABEL, deployment),
    ):
        if value is not None:
            labels[key] = label_value(value)
    return labels


def common_labels(
    component: str,
    instance: str,
    application: str | None = None,
    deployment: str | None = None,
) -> dict[str, str]:
    """The labels of every child object (and pod) of the given component, per the contract."""
    return {
        **selector_labels(
            component, instance=instance, application=application, deployment=deployment
        ),
        MANAGED_BY_LABEL: PRODUCT,
    }


def owner_reference(
    owner: Mapping[str, Any], controller: bool = True, *, block_owner_deletion: bool = True
) -> OwnerReference:
    """An ownerReference to ``owner``: a whole object, or ``{apiVersion, kind, name, uid}``.

    ``block_owner_deletion`` keeps the owner (under foreground deletion) until this child is gone;
    where the OwnerReferencesPermissionEnforcement admission plugin is enabled, it requires
    ``update`` on the owner's ``finalizers`` subresource.
    """
    meta = owner.get("metadata", owner)
    return {
        "apiVersion": str(owner["apiVersion"]),
        "kind": str(owner["kind"]),
        "name": str(meta["name"]),
        "uid": str(meta["uid"]),
        "controller": controller,
        "blockOwnerDeletion": block_owner_deletion,
    }
