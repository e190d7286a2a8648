"""GET /api/serve/applications/ from what a backend observes: Ray 2.60's ServeInstanceDetails.

As Ray's ``get_serve_instance_details``, one builder turns the controller's view into the response
models of :mod:`kubeserve.schema.status`; every backend fills the plain views below from what it
observes (processes and the store locally, cached objects on Kubernetes) and nothing else: the
Ray spellings (actor names, the topology, resources, the defaults of a deployment not yet
reported) are decided here, once.

The models are built with exactly the fields kubeserve reports, so the answer on the wire is
``details.model_dump(mode="json", exclude_unset=True)`` (:func:`details_body`); every key of Ray
2.60's answer is among them, at every level (a test compares the key sets with Ray's models).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.rollout import RAY_DEFAULT, RolloutPolicy
from kubeserve.schema.config import ServeApplicationSchema
from kubeserve.schema.limits import MAX_APPLICATIONS
from kubeserve.schema.status import (
    APIType,
    ApplicationDetails,
    ApplicationStatusInfo,
    DeploymentAutoscalingDetail,
    DeploymentDetails,
    DeploymentNode,
    DeploymentStatusInfo,
    DeploymentTopology,
    ProxyDetails,
    ReplicaDetails,
    ReportedDeploymentConfig,
    ServeActorDetails,
    ServeInstanceDetails,
    ServeStatusSchema,
    Target,
    TargetGroup,
    empty_instance_details,
)

__all__ = [
    "ApplicationDetailsView",
    "ControllerHealth",
    "DeploymentDetailsView",
    "InstanceDetailsView",
    "ProcessView",
    "ProxyView",
    "ReplicaProcessView",
    "controller_process",
    "details_body",
    "details_json",
    "instance_details",
    "single_app_status",
]

_K = TypeVar("_K")
_V = TypeVar("_V")

#: Ray's name of the controller actor (kubeserve's controller: ``kubeserve start`` or the operator)
CONTROLLER_ACTOR_NAME = "SERVE_CONTROLLER_ACTOR"


@dataclass(frozen=True)
class ProcessView:
    """A process of the serving layer where Ray has an actor: node, ids and its log."""

    node_id: str
    node_ip: str
    actor_id: str
    worker_id: str
    log_file_path: str


@dataclass(frozen=True)
class ProxyView:
    """One HTTP proxy; ``status`` is a :class:`~kubeserve.schema.status.ProxyStatus` value."""

    process: ProcessView
    status: str


@dataclass(frozen=True)
class ReplicaProcessView:
    """One replica; ``state`` is a :class:`~kubeserve.schema.status.ReplicaState` value."""

    process: ProcessView
    replica_id: str
    state: str
    pid: int | None
    start_time_s: float


@dataclass(frozen=True)
class DeploymentDetailsView:
    """One deployment of the current graph with its effective config (every field filled).

    The status fields are the last derived (:mod:`kubeserve.control.status_derivation`); a
    deployment not reported yet is starting its update, which the defaults say.
    """

    name: str
    config: EffectiveDeployment
    target_replicas: int
    replicas: Sequence[ReplicaProcessView] = ()
    status: str = "UPDATING"
    status_trigger: str = "CONFIG_UPDATE_STARTED"
    message: str = ""
    #: Ray's ``DeploymentAutoscalingDetail`` fields (``scaling_status``, ``decisions`` with why
    #: the target changed, ``metrics``) of an autoscaling deployment, else ``None``
    autoscaling: Mapping[str, Any] | None = None
    #: replicas that stopped lately, newest last (Ray keeps ten, for their logs)
    recent_dead_replicas: Sequence[ReplicaProcessView] = ()


@dataclass(frozen=True)
class ApplicationDetailsView:
    """One application as the backend reports it.

    ``config`` is the REST config as given (``None`` when the stored config breaks a REST rule);
    ``graph`` is the build's graph of the current code (``None`` while it builds or when it
    failed), whose ``deployments`` entries carry ``name``, ``outbound`` and ``is_ingress``.
    """

    name: str
    route_prefix: str | None
    status: str
    message: str
    deployed_at: float
    config: Mapping[str, Any] | None
    deployments: Sequence[DeploymentDetailsView] = ()
    graph: Mapping[str, Any] | None = None
    docs_path: str | None = None
    #: ``declarative`` (a config) or ``imperative`` (``serve.run``: no ``deployed_app_config``)
    api_type: str = "declarative"


@dataclass(frozen=True)
class ControllerHealth:
    """What kubeserve measures of its controller process, in Ray's ``ControllerHealthMetrics``
    spelling (:meth:`as_metrics`); the rest of Ray's telemetry is about Ray's actors."""

    timestamp: float
    started_at: float
    asyncio_tasks: int
    memory_mb: float

    def as_metrics(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "controller_start_time": self.started_at,
            "num_asyncio_tasks": self.asyncio_tasks,
            "process_memory_mb": self.memory_mb,
        }


#: How a backend replaces a deployment's replicas, in Ray's ``deployment_config`` fields: the
#: share of replicas replaced at a time and the extra replicas allowed meanwhile (percent).
Rollout = RolloutPolicy


@dataclass(frozen=True)
class InstanceDetailsView:
    """The running serving layer: its controller, REST instance options, proxies by node."""

    controller: ProcessView
    #: the instance-level REST fields (``proxy_location``, ``http_options``...), defaults filled
    options: Mapping[str, Any]
    proxies: Mapping[str, ProxyView] = field(default_factory=dict)
    applications: Sequence[ApplicationDetailsView] = ()
    health: ControllerHealth | None = None
    #: the backend's rollout, reported as ``rolling_update_percentage`` and ``max_surge_percent``
    #: of every deployment whose config sets neither
    rollout: Rollout = RAY_DEFAULT


def controller_process(node_id: str, node_ip: str, pid: int, log_file_path: str) -> ProcessView:
    """The controller as Ray names its actor: ids from its process id."""
    return ProcessView(node_id, node_ip, f"controller-{pid}", str(pid), log_file_path)


def instance_details(view: InstanceDetailsView | None) -> ServeInstanceDetails:
    """The details of a serving layer; ``None`` (nothing runs) is Ray's empty answer, whose
    ``controller_info`` has no ``node_id``: that tells ``serve shutdown`` nothing is to stop."""
    if view is None:
        return empty_instance_details()
    options = view.options
    return ServeInstanceDetails(
        controller_info=_actor(view.controller, CONTROLLER_ACTOR_NAME),
        proxy_location=options.get("proxy_location", "EveryNode"),
        http_options=options.get("http_options", {}),
        grpc_options=options.get("grpc_options", {}),
        proxies={
            node: ProxyDetails(**_process(proxy.process, _proxy_actor(node)), status=proxy.status)
            for node, proxy in view.proxies.items()
        },
        applications={
            app.name: _APPLICATIONS.model(app, view.rollout) for app in view.applications
        },
        target_capacity=options.get("target_capacity"),
        target_groups=_target_groups(view),
        controller_health_metrics=None if view.health is None else view.health.as_metrics(),
        # A config override removed gives the code's value back: the effective config is
        # computed afresh from code and config at every apply (control/effective_config.py).
        restores_unset_config_options=True,
    )


def _proxy_actor(node: str) -> str:
    return f"SERVE_PROXY_ACTOR-{node}"


def _target_groups(view: InstanceDetailsView) -> list[TargetGroup]:
    """Where clients reach the applications, as Ray reports it without direct ingress: one HTTP
    group on ``/`` listing every healthy proxy on the HTTP port (none without proxies; kubeserve
    serves no gRPC, so no gRPC group)."""
    if not view.proxies:
        return []
    port = int((view.options.get("http_options") or {}).get("port", 8000))
    targets = [
        Target(ip=proxy.process.node_ip, port=port, instance_id=node, name=_proxy_actor(node))
        for node, proxy in view.proxies.items()
        if proxy.status == "HEALTHY"
    ]
    return [
        TargetGroup(
            targets=targets,
            route_prefix="/",
            protocol="HTTP",
            app_name="",
            ingress_request_router_targets=[],
            ingress_deployment_name="",
        )
    ]


def details_body(details: ServeInstanceDetails) -> dict[str, Any]:
    """The JSON body of GET /api/serve/applications/: the fields the builder set, nothing else."""
    return details.model_dump(mode="json", exclude_unset=True)


def details_json(details: ServeInstanceDetails) -> bytes:
    """:func:`details_body` as JSON text: each application's part is dumped once per version of
    it (:class:`_Applications`), the rest at every call."""
    body = details.model_dump(mode="json", exclude_unset=True, exclude={"applications"})
    parts = [
        f"{json.dumps(key)}:{json.dumps(value)}"
        for key, value in body.items()
        if key not in _AFTER_APPLICATIONS
    ]
    if "applications" in details.model_fields_set:
        apps = (
            f"{json.dumps(name)}:{_APPLICATIONS.json(app)}"
            for name, app in details.applications.items()
        )
        parts.append('"applications":{' + ",".join(apps) + "}")
    parts += (
        f"{json.dumps(key)}:{json.dumps(body[key])}" for key in _AFTER_APPLICATIONS if key in body
    )
    return ("{" + ",".join(parts) + "}").encode()


def single_app_status(name: str, app: ApplicationDetails | None) -> ServeStatusSchema:
    """GET /api/serve/deployments/status of the application ``name`` (``None``: not started)."""
    if app is None:
        return ServeStatusSchema(name=name, app_status=ApplicationStatusInfo(status="NOT_STARTED"))
    return ServeStatusSchema(
        name=name,
        app_status=ApplicationStatusInfo(
            status=app.status, message=app.message, deployment_timestamp=app.last_deployed_time_s
        ),
        deployment_statuses=[
            DeploymentStatusInfo(name=d.name, status=d.status, message=d.message)
            for d in app.deployments.values()
        ],
    )


class _Applications:
    """The details of every application as last reported, with their JSON part, by name.

    An application whose view equals the one reported last (nothing changed: the common case
    while 1,000 applications deploy, a few at a time) is answered with the same model and the
    same JSON part, not validated and dumped again; comparing two views costs microseconds.
    Models are never changed once built, so handing the same one to several GETs is safe.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[ApplicationDetailsView, Rollout, ApplicationDetails]] = {}
        self._bodies: dict[int, tuple[ApplicationDetails, str]] = {}

    def model(self, view: ApplicationDetailsView, rollout: Rollout) -> ApplicationDetails:
        entry = self._entries.get(view.name)
        if entry is not None and entry[1] == rollout and entry[0] == view:
            return entry[2]
        model = _application(view, rollout)
        if entry is not None:
            self._bodies.pop(id(entry[2]), None)
        self._entries[view.name] = (view, rollout, model)
        if len(self._entries) > _KEPT:  # names gone long ago; the next GET refills the rest
            self._entries.clear()
            self._bodies.clear()
        return model

    def json(self, model: ApplicationDetails) -> str:
        """``model`` as JSON text, as :func:`details_body` dumps it."""
        entry = self._bodies.get(id(model))
        if entry is not None and entry[0] is model:
            return entry[1]
        text = json.dumps(model.model_dump(mode="json", exclude_unset=True))
        if self._entries.get(model.name, (None, None, None))[2] is model:
            self._bodies[id(model)] = (model, text)
        return text


def _application(app: ApplicationDetailsView, rollout: Rollout) -> ApplicationDetails:
    config = app.config or {}
    imperative = app.api_type == APIType.IMPERATIVE.value
    return ApplicationDetails(
        name=app.name,
        route_prefix=app.route_prefix,
        docs_path=app.docs_path,
        status=app.status,
        message=app.message,
        last_deployed_time_s=app.deployed_at,
        deployed_app_config=None
        if app.config is None or imperative
        else _CONFIG_MODELS.get(app.config, rollout),
        source=APIType.IMPERATIVE if imperative else APIType.DECLARATIVE,
        deployments={d.name: _deployment(app.name, d, rollout) for d in app.deployments},
        external_scaler_enabled=bool(config.get("external_scaler_enabled", False)),
        deployment_topology=None if app.graph is None else _topology(app.name, app.graph),
    )


class _Derived(Generic[_K, _V]):
    """Values derived from objects never changed once made (stored application configs,
    effective deployment configs), kept for the last ``size`` objects asked about, by identity.

    A GET of 1,000 applications validated every config into its model again: ~100 ms of the
    event loop per GET. The objects are the backends' own (the store's configs, a deployment's
    effective config) and live as long as their version does, so a GET now validates only what
    changed since the last one. An entry holds its object, so an id is never reused while kept.
    """

    def __init__(self, derive: Callable[[_K, Rollout], _V], size: int) -> None:
        self._derive = derive
        self._size = size
        self._entries: OrderedDict[int, tuple[_K, Rollout, _V]] = OrderedDict()

    def get(self, key: _K, rollout: Rollout) -> _V:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0] is key and entry[1] == rollout:
            self._entries.move_to_end(id(key))
            return entry[2]
        value = self._derive(key, rollout)
        self._entries[id(key)] = (key, rollout, value)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value


def _validate_config(config: Mapping[str, Any], rollout: Rollout) -> ServeApplicationSchema:
    return ServeApplicationSchema.model_validate(config)


def _validate_deployment_config(
    config: EffectiveDeployment, rollout: Rollout
) -> ReportedDeploymentConfig:
    # the rollout the deployment gets: the backend's unless its config sets one
    policy = config.rollout(rollout)
    return ReportedDeploymentConfig.model_validate(
        {
            **config.as_dict(),
            "rolling_update_percentage": policy.rolling_update_percentage,
            "max_surge_percent": policy.max_surge_percent,
        }
    )


#: room for two full configs of the largest size (the previous one and the current one)
_KEPT = 2 * MAX_APPLICATIONS
_CONFIG_MODELS = _Derived(_validate_config, _KEPT)
_DEPLOYMENT_CONFIG_MODELS = _Derived(_validate_deployment_config, 4 * _KEPT)
_APPLICATIONS = _Applications()
#: the fields of ServeInstanceDetails after ``applications``, in the order the model has them
_AFTER_APPLICATIONS = tuple(ServeInstanceDetails.model_fields)[
    tuple(ServeInstanceDetails.model_fields).index("applications") + 1 :
]


def _deployment(app: str, deployment: DeploymentDetailsView, rollout: Rollout) -> DeploymentDetails:
    def replica(view: ReplicaProcessView) -> ReplicaDetails:
        return ReplicaDetails(
            **_process(view.process, f"SERVE_REPLICA::{app}#{deployment.name}#{view.replica_id}"),
            replica_id=view.replica_id,
            state=view.state,
            pid=view.pid,
            start_time_s=view.start_time_s,
        )

    return DeploymentDetails.model_validate(
        {
            "name": deployment.name,
            "status": deployment.status,
            "status_trigger": deployment.status_trigger,
            "message": deployment.message,
            "deployment_config": _DEPLOYMENT_CONFIG_MODELS.get(deployment.config, rollout),
            "target_num_replicas": deployment.target_replicas,
            "required_resources": deployment.config.required_resources(),
            "replicas": [replica(view) for view in deployment.replicas],
            "recent_dead_replicas": [replica(view) for view in deployment.recent_dead_replicas],
            "autoscaling_detail": (
                None
                if deployment.autoscaling is None
                else DeploymentAutoscalingDetail.model_validate(deployment.autoscaling)
            ),
        }
    )


def _topology(app: str, graph: Mapping[str, Any]) -> DeploymentTopology:
    """Which deployment calls which, from the build's graph."""
    nodes = {
        node["name"]: DeploymentNode(
            name=node["name"],
            app_name=app,
            outbound_deployments=[
                {"name": target, "app_name": app} for target in node.get("outbound", [])
            ],
            is_ingress=bool(node.get("is_ingress")),
        )
        for node in graph["deployments"]
    }
    return DeploymentTopology(app_name=app, nodes=nodes, ingress_deployment=graph.get("ingress"))


def _actor(process: ProcessView, actor_name: str) -> ServeActorDetails:
    return ServeActorDetails(**_process(process, actor_name))


def _process(process: ProcessView, actor_name: str) -> dict[str, Any]:
    """The process-info fields every Ray actor entry has, in Ray's order."""
    return {
        "node_id": process.node_id,
        "node_ip": process.node_ip,
        "node_instance_id": process.node_id,
        "actor_id": process.actor_id,
        "actor_name": actor_name,
        "worker_id": process.worker_id,
        "log_file_path": process.log_file_path,
    }
