"""GET /api/serve/applications/ of the Kubernetes backend: the backend-neutral views of what runs.

:func:`kubeserve.control.details.instance_details` builds Ray 2.60's ServeInstanceDetails from
them; this module reads only objects the operator's caches already hold (the ``ServeInstance``, its
``ServeApplication`` custom resources with the status the operator wrote, their build-graph
ConfigMaps and the proxy and replica pods), so answering a GET makes no API request. Only the
values that name processes differ from the local backend's: a replica is a pod (``replica_id`` is
the pod's name, ``node_id`` its node, ``pid`` unknown), a proxy is a proxy pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kubeserve.backends.kubernetes.pods import exit_failure, pod_ready
from kubeserve.backends.kubernetes.render import ROLLOUT
from kubeserve.backends.kubernetes.render_views import (
    InstanceView,
    app_view,
    build_name,
    own_graph_name,
)
from kubeserve.backends.kubernetes.render_views import instance_view as render_instance_view
from kubeserve.backends.process_health import controller_health
from kubeserve.control import effective_config
from kubeserve.control.details import (
    ApplicationDetailsView,
    DeploymentDetailsView,
    InstanceDetailsView,
    ProcessView,
    ProxyView,
    ReplicaProcessView,
    controller_process,
)
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.instance import tracing_config
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.graph import graph_document
from kubeserve.schema.config import ServeDeploySchema, is_default_policy, policy_function_name
from kubeserve.schema.limits import MAX_APPLICATIONS
from kubeserve.schema.resources import (
    DeploymentStatusEntry,
    ServeApplicationSpec,
    ServeApplicationStatus,
    ServeInstanceSpec,
)
from kubeserve.schema.status import APIType

__all__ = [
    "DEPLOYED_AT_ANNOTATION",
    "ClusterView",
    "ControllerIdentity",
    "annotated_deployed_at",
    "app_config",
    "instance_options",
    "instance_view",
    "pod_process",
]

#: On a ``ServeApplication`` the admin API wrote: when its spec last changed (epoch seconds).
DEPLOYED_AT_ANNOTATION = "kubeserve.io/deployed-at"

Obj = dict[str, Any]


@dataclass(frozen=True)
class ControllerIdentity:
    """The process that plays Ray's controller: the operator (``node_id`` must be set, or the
    ``serve shutdown`` client refuses to send its DELETE)."""

    node_id: str
    node_ip: str
    pid: int


@dataclass(frozen=True)
class ClusterView:
    """The cached objects of one namespace the details are built from."""

    instance: Obj | None
    applications: list[Obj]
    #: (kind, labels) -> cached objects of the namespace whose labels include ``labels``
    objects: Callable[[str, dict[str, str]], list[Obj]]
    #: ConfigMap name -> cached ConfigMap
    configmap: Callable[[str], Obj | None]


def instance_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The REST instance options of a ``ServeInstance`` spec, every default filled (the form the
    API hands to :meth:`Backend.apply` and the local backend reports)."""
    given = ServeInstanceSpec.model_validate(dict(spec)).rest_options()
    full = ServeDeploySchema.model_validate({**given, "applications": []})
    return full.model_dump(mode="json", exclude={"applications"})


def app_config(obj: Obj) -> dict[str, Any] | None:
    """The REST config of a ``ServeApplication`` (only the fields its spec sets), or ``None`` when
    the spec breaks a REST rule (the operator reports that in the status).

    Translated once per version of the spec (``metadata.generation``, which the API server moves
    at every spec change) and shared: GET /api/serve/applications/ used to validate every
    application's spec again at each call. The dict returned is never to be changed.
    """
    meta = obj.get("metadata") or {}
    key = (meta.get("uid"), meta.get("generation"))
    if key[0] is None or key[1] is None:
        return _translate(obj)
    if key not in _CONFIGS:
        if len(_CONFIGS) >= _CONFIGS_KEPT:
            _CONFIGS.clear()
        _CONFIGS[key] = _translate(obj)
    return _CONFIGS[key]


#: :func:`app_config` by (uid, generation); cleared when full (the next GET refills it)
_CONFIGS: dict[tuple[Any, Any], dict[str, Any] | None] = {}
_CONFIGS_KEPT = 4 * MAX_APPLICATIONS


def _translate(obj: Obj) -> dict[str, Any] | None:
    try:
        spec = ServeApplicationSpec.model_validate(obj.get("spec") or {})
        return spec.app_config(name=contract.application_name(obj))
    except ValidationError:
        return None


def instance_view(view: ClusterView, controller: ControllerIdentity) -> InstanceDetailsView | None:
    """``None`` when no ``ServeInstance`` exists (nothing runs)."""
    if view.instance is None:
        return None
    instance_name = view.instance["metadata"]["name"]
    options = instance_options(view.instance.get("spec") or {})
    tracing = tracing_config(options)  # part of the build key
    try:  # what the build's name is made of
        rendered: InstanceView | None = render_instance_view(view.instance)
    except ValidationError:
        rendered = None
    return InstanceDetailsView(
        controller=controller_process(controller.node_id, controller.node_ip, controller.pid, ""),
        options=options,
        proxies=_proxies(view, instance_name),
        applications=[
            _application(view, obj, tracing, rendered)
            for obj in view.applications
            if contract.instance_of(obj) == instance_name
        ],
        health=controller_health(),
        rollout=ROLLOUT,
    )


def _proxies(view: ClusterView, instance_name: str) -> dict[str, ProxyView]:
    labels = {
        contract.COMPONENT_LABEL: contract.COMPONENT_PROXY,
        contract.INSTANCE_LABEL: contract.label_value(instance_name),
    }
    proxies: dict[str, ProxyView] = {}
    for pod in sorted(view.objects("Pod", labels), key=pod_ready):  # a ready pod wins its node
        status = "HEALTHY" if pod_ready(pod) else "UNHEALTHY" if exit_failure(pod) else "STARTING"
        if pod["metadata"].get("deletionTimestamp"):
            status = "DRAINING"
        proxies[_node(pod)] = ProxyView(pod_process(pod), status)
    return proxies


def _application(
    view: ClusterView,
    obj: Obj,
    tracing: Mapping[str, Any] | None,
    instance: InstanceView | None,
) -> ApplicationDetailsView:
    status = ServeApplicationStatus.of(obj)
    config = app_config(obj)
    graph = _graph(view, obj, config, tracing, instance)
    return ApplicationDetailsView(
        name=contract.application_name(obj),
        route_prefix=_route_prefix(status, config),
        status=_app_status(obj, status),
        message=status.message,
        deployed_at=_deployed_at(obj, status),
        config=config,
        deployments=_deployments(view, obj, status, config, graph),
        graph=graph,
        docs_path=status.docs_path,
        api_type=(APIType.IMPERATIVE if _imperative(obj) else APIType.DECLARATIVE).value,
    )


def _imperative(obj: Obj) -> bool:
    """Deployed with ``serve.run`` (``spec.pickledGraph``), whatever else its spec holds."""
    return bool((obj.get("spec") or {}).get("pickledGraph"))


def _app_status(obj: Obj, status: ServeApplicationStatus) -> str:
    """The operator's status while it describes the current spec; ``DEPLOYING`` before that."""
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        return "DELETING"
    current = status.observed_generation == meta.get("generation")
    if not current or not status.app_status:
        return "DEPLOYING"
    return str(status.app_status)


def route_prefix(obj: Obj) -> str | None:
    """The route prefix of a ``ServeApplication``: as served once built, else as configured."""
    return _route_prefix(ServeApplicationStatus.of(obj), app_config(obj))


def _route_prefix(status: ServeApplicationStatus, config: Mapping[str, Any] | None) -> str | None:
    if "route_prefix" in status.model_fields_set:
        return status.route_prefix
    if config is not None and "route_prefix" in config:
        value = config["route_prefix"]
        return None if value is None else str(value)
    return "/"


def annotated_deployed_at(obj: Mapping[str, Any]) -> float | None:
    """When the admin API last changed the spec of a ``ServeApplication`` (``None``: it did not,
    or the annotation is not a number)."""
    annotation = (obj["metadata"].get("annotations") or {}).get(DEPLOYED_AT_ANNOTATION)
    try:
        return float(annotation) if annotation else None
    except ValueError:
        return None


def _deployed_at(obj: Obj, status: ServeApplicationStatus) -> float:
    """The annotation, else the operator's ``lastDeployedTime``, else the object's creation."""
    annotated = annotated_deployed_at(obj)
    if annotated is not None:
        return annotated
    if status.last_deployed_time is not None:
        return status.last_deployed_time.timestamp()
    return _epoch(obj["metadata"].get("creationTimestamp") or "")


def _graph(
    view: ClusterView,
    obj: Obj,
    config: Mapping[str, Any] | None,
    tracing: Mapping[str, Any] | None,
    instance: InstanceView | None,
) -> Obj | None:
    """The build's graph of the current code and instance ``tracing`` config (``None`` while it
    builds or when it failed)."""
    if config is None or instance is None:
        return None
    app = app_view(obj, config, tracing)
    configmap = view.configmap(build_name(instance, app)) or view.configmap(own_graph_name(app))
    if configmap is None:
        return None
    try:
        graph = graph_document(configmap)
    except ValueError:
        return None
    return graph if isinstance(graph, dict) and "deployments" in graph else None


def _deployments(
    view: ClusterView,
    obj: Obj,
    status: ServeApplicationStatus,
    config: Mapping[str, Any] | None,
    graph: Obj | None,
) -> list[DeploymentDetailsView]:
    if graph is None or config is None:
        return []
    deployments = []
    for name, effective in effective_config.graph_configs(config, graph["deployments"]).items():
        labels = contract.selector_labels(
            contract.COMPONENT_REPLICA, application=obj["metadata"]["name"], deployment=name
        )
        replicas = [_replica(pod) for pod in view.objects("Pod", labels)]
        entry = status.deployments.get(name)
        if entry is None:  # not reported yet: starting its update
            described = DeploymentDetailsView(
                name, effective, effective.target_replicas(), replicas
            )
        else:
            described = DeploymentDetailsView(
                name=name,
                config=effective,
                target_replicas=entry.target_replicas,
                replicas=replicas,
                status=str(entry.status),
                status_trigger=str(entry.status_trigger),
                message=entry.message,
            )
        autoscaling = _autoscaling(effective, entry, described.target_replicas, replicas)
        deployments.append(dataclasses.replace(described, autoscaling=autoscaling))
    return deployments


def _autoscaling(
    effective: EffectiveDeployment,
    entry: DeploymentStatusEntry | None,
    target: int,
    replicas: list[ReplicaProcessView],
) -> dict[str, Any] | None:
    """Ray's ``DeploymentAutoscalingDetail`` of an autoscaling deployment, from its status."""
    if not effective.autoscaling_config:
        return None
    running = sum(1 for r in replicas if r.state == "RUNNING")
    scaling = "UPSCALING" if target > running else "DOWNSCALING" if target < running else "STABLE"
    last = None if entry is None else entry.last_scaling_decision
    decisions = []
    if last is not None:
        policy = effective.autoscaling_config.get("policy")
        name = "default_autoscaling_policy"
        if not is_default_policy(policy):
            name = str(policy_function_name((policy or {})["policy_function"]))
        decisions.append({**last.model_dump(by_alias=False), "policy": name})
    return {"scaling_status": scaling, "decisions": decisions}


def _replica(pod: Obj) -> ReplicaProcessView:
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        state = "STOPPING"
    else:
        state = "RUNNING" if pod_ready(pod) else "STARTING"
    return ReplicaProcessView(
        pod_process(pod),
        replica_id=meta["name"],
        state=state,
        pid=None,
        start_time_s=_epoch(status.get("startTime") or meta.get("creationTimestamp") or ""),
    )


def pod_process(pod: Obj) -> ProcessView:
    """A pod as the process Ray would have an actor for."""
    meta = pod["metadata"]
    return ProcessView(
        node_id=_node(pod),
        node_ip=(pod.get("status") or {}).get("hostIP", ""),
        actor_id=meta.get("uid", ""),
        worker_id=meta["name"],
        log_file_path="",
    )


def _node(pod: Obj) -> str:
    """The node a pod runs on (its own name until it is scheduled)."""
    return str((pod.get("spec") or {}).get("nodeName") or pod["metadata"]["name"])


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp (RFC 3339, ``...Z``); 0 when absent."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
