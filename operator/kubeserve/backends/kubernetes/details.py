"""GET /api/serve/applications/ of the Kubernetes backend: Ray 2.60's ServeInstanceDetails.

Pure formatting of objects the operator's caches already hold (the ``ServeInstance``, its
``ServeApplication`` custom resources with the status the operator wrote, their build-graph
ConfigMaps and the proxy and replica pods), so answering a GET makes no API request. The shape is
the local backend's (:mod:`kubeserve.backends.local.details`) key for key; only the values that
name processes differ: a replica is a pod (``replica_id`` is the pod's name, ``node_id`` its node,
``pid`` unknown), a proxy is a proxy pod.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kubeserve.backends.kubernetes import names
from kubeserve.backends.kubernetes.pods import pod_ready
from kubeserve.backends.kubernetes.render_views import app_view
from kubeserve.control import config as config_rules
from kubeserve.schema.config import ServeDeploySchema
from kubeserve.schema.resources import DEFAULT_INSTANCE, ServeApplicationSpec, ServeInstanceSpec

__all__ = [
    "DEPLOYED_AT_ANNOTATION",
    "ClusterView",
    "ControllerIdentity",
    "app_config",
    "app_name",
    "empty_details",
    "instance_details",
    "instance_options",
]

#: On a ``ServeApplication`` the admin API wrote: when its spec last changed (epoch seconds).
DEPLOYED_AT_ANNOTATION = "kubeserve.io/deployed-at"

Obj = dict[str, Any]


def empty_details() -> dict[str, Any]:
    """What Ray 2.60 answers when no serving layer runs."""
    return {"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None}


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


def app_name(obj: Obj) -> str:
    """The Ray name of a ``ServeApplication``: ``spec.appName``, else the object's name.

    Ray's single-application family names its application ``""``, which ``spec.appName`` cannot
    hold; the admin API marks such an object with an empty ``kubeserve.io/application-name``.
    """
    annotations = obj["metadata"].get("annotations") or {}
    if annotations.get(names.APPLICATION_NAME_ANNOTATION) == "":
        return ""
    return str((obj.get("spec") or {}).get("appName") or obj["metadata"]["name"])


def app_config(obj: Obj) -> dict[str, Any] | None:
    """The REST config of a ``ServeApplication`` (only the fields its spec sets), or ``None`` when
    the spec breaks a REST rule (the operator reports that in the status)."""
    try:
        spec = ServeApplicationSpec.model_validate(obj.get("spec") or {})
        config: dict[str, Any] = spec.to_rest(name=obj["metadata"]["name"]).model_dump(
            mode="json", exclude_unset=True
        )
    except ValidationError:
        return None
    config["name"] = app_name(obj)
    return config


def instance_details(view: ClusterView, controller: ControllerIdentity) -> dict[str, Any]:
    if view.instance is None:
        return empty_details()
    options = instance_options(view.instance.get("spec") or {})
    instance_name = view.instance["metadata"]["name"]
    return {
        "controller_info": {
            "node_id": controller.node_id,
            "node_ip": controller.node_ip,
            "actor_id": f"controller-{controller.pid}",
            "actor_name": "SERVE_CONTROLLER_ACTOR",
            "worker_id": str(controller.pid),
            "log_file_path": "",
        },
        "proxy_location": options.get("proxy_location", "EveryNode"),
        "http_options": options.get("http_options", {}),
        "grpc_options": options.get("grpc_options", {}),
        "proxies": _proxies(view, instance_name),
        "applications": {
            app_name(obj): _application(view, obj)
            for obj in view.applications
            if (obj.get("spec") or {}).get("instance", DEFAULT_INSTANCE) == instance_name
        },
        "target_capacity": options.get("target_capacity"),
    }


def _proxies(view: ClusterView, instance_name: str) -> dict[str, Any]:
    labels = {
        names.COMPONENT_LABEL: names.COMPONENT_PROXY,
        names.INSTANCE_LABEL: names.label_value(instance_name),
    }
    proxies: dict[str, Any] = {}
    for pod in sorted(view.objects("Pod", labels), key=pod_ready):  # a ready pod wins its node
        node = _node(pod)
        proxies[node] = {
            **_process(pod),
            "actor_name": f"SERVE_PROXY_ACTOR-{node}",
            "status": "DRAINING"
            if pod["metadata"].get("deletionTimestamp")
            else ("HEALTHY" if pod_ready(pod) else "STARTING"),
        }
    return proxies


def _application(view: ClusterView, obj: Obj) -> dict[str, Any]:
    status = obj.get("status") or {}
    config = app_config(obj)
    name = app_name(obj)
    graph = _graph(view, obj, config)
    body: dict[str, Any] = {
        "name": name,
        "route_prefix": _route_prefix(status, config),
        "docs_path": status.get("docsPath"),
        "status": _app_status(obj),
        "message": str(status.get("message") or ""),
        "last_deployed_time_s": _deployed_at(obj),
    }
    if config is not None:
        body["deployed_app_config"] = config
    body.update(
        source="declarative",
        deployments=_deployments(view, obj, config, graph),
        external_scaler_enabled=bool((config or {}).get("external_scaler_enabled", False)),
    )
    if graph is not None:
        body["deployment_topology"] = _topology(name, graph)
    return body


def _app_status(obj: Obj) -> str:
    """The operator's status while it describes the current spec; ``DEPLOYING`` before that."""
    meta, status = obj["metadata"], obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "DELETING"
    current = status.get("observedGeneration") == meta.get("generation")
    if not current or not status.get("appStatus"):
        return "DEPLOYING"
    return str(status["appStatus"])


def _route_prefix(status: Mapping[str, Any], config: Mapping[str, Any] | None) -> str | None:
    if "routePrefix" in status:
        value = status["routePrefix"]
        return None if value is None else str(value)
    if config is not None and "route_prefix" in config:
        value = config["route_prefix"]
        return None if value is None else str(value)
    return "/"


def _deployed_at(obj: Obj) -> float:
    meta, status = obj["metadata"], obj.get("status") or {}
    annotation = (meta.get("annotations") or {}).get(DEPLOYED_AT_ANNOTATION)
    if annotation:
        try:
            return float(annotation)
        except ValueError:
            pass
    for stamp in (status.get("lastDeployedTime"), meta.get("creationTimestamp")):
        if stamp:
            return _epoch(stamp)
    return 0.0


def _graph(view: ClusterView, obj: Obj, config: Mapping[str, Any] | None) -> Obj | None:
    """The build's graph of the current code (``None`` while it builds or when it failed)."""
    if config is None:
        return None
    key = app_view(obj, config).build_key
    configmap = view.configmap(names.graph_configmap_name(obj["metadata"]["name"], key))
    if configmap is None:
        return None
    try:
        graph = json.loads((configmap.get("data") or {}).get("graph.json", "{}"))
    except ValueError:
        return None
    return graph if isinstance(graph, dict) and "deployments" in graph else None


def _deployments(
    view: ClusterView, obj: Obj, config: Mapping[str, Any] | None, graph: Obj | None
) -> dict[str, Any]:
    if graph is None or config is None:
        return {}
    overrides = {d["name"]: d for d in config.get("deployments", [])}
    statuses = (obj.get("status") or {}).get("deployments") or {}
    deployments = {}
    for node in graph["deployments"]:
        name = node["name"]
        effective = config_rules.effective_deployment_config(
            name, node.get("options", {}), overrides.get(name)
        )
        status = statuses.get(name) or {}
        labels = names.selector_labels(
            names.COMPONENT_REPLICA, application=obj["metadata"]["name"], deployment=name
        )
        deployments[name] = {
            "name": name,
            "status": status.get("status", "UPDATING"),
            "status_trigger": status.get("statusTrigger", "CONFIG_UPDATE_STARTED"),
            "message": str(status.get("message") or ""),
            "deployment_config": effective,
            "target_num_replicas": int(
                status.get("targetReplicas", config_rules.target_replicas(effective))
            ),
            "required_resources": config_rules.required_resources(effective),
            "replicas": [_replica(pod, app_name(obj), name) for pod in view.objects("Pod", labels)],
        }
    return deployments


def _replica(pod: Obj, app: str, deployment: str) -> dict[str, Any]:
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        state = "STOPPING"
    else:
        state = "RUNNING" if pod_ready(pod) else "STARTING"
    return {
        **_process(pod),
        "actor_name": f"SERVE_REPLICA::{app}#{deployment}#{meta['name']}",
        "replica_id": meta["name"],
        "state": state,
        "pid": None,
        "start_time_s": _epoch(status.get("startTime") or meta.get("creationTimestamp") or ""),
    }


def _process(pod: Obj) -> dict[str, Any]:
    """The process-info fields every Ray actor entry has, for a pod."""
    meta = pod["metadata"]
    return {
        "node_id": _node(pod),
        "node_ip": (pod.get("status") or {}).get("hostIP", ""),
        "actor_id": meta.get("uid", ""),
        "actor_name": meta["name"],
        "worker_id": meta["name"],
        "log_file_path": "",
    }


def _node(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or pod["metadata"]["name"])


def _topology(app: str, graph: Obj) -> dict[str, Any]:
    nodes = {
        node["name"]: {
            "name": node["name"],
            "app_name": app,
            "outbound_deployments": [
                {"name": target, "app_name": app} for target in node.get("outbound", [])
            ],
            "is_ingress": bool(node.get("is_ingress")),
        }
        for node in graph["deployments"]
    }
    return {"app_name": app, "nodes": nodes, "ingress_deployment": graph.get("ingress")}


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp (RFC 3339, ``...Z``); 0 when absent."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
