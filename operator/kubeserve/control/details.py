"""GET /api/serve/applications/ from what a backend observes: Ray 2.60's ServeInstanceDetails.

As Ray's ``get_serve_instance_details``, one builder turns the controller's view into the response
models of :mod:`kubeserve.schema.status`; every backend fills the plain views below from what it
observes (processes and the store locally, cached objects on Kubernetes) and nothing else: the
Ray spellings (actor names, the topology, resources, the defaults of a deployment not yet
reported) are decided here, once.

The models are built with exactly the fields kubeserve reports, so the answer on the wire is
``details.model_dump(mode="json", exclude_unset=True)`` (:func:`details_body`): Ray's optional
fields kubeserve does not track (``target_groups``, ``recent_dead_replicas``...) stay out of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeserve.control.effective_config import EffectiveDeployment
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
    ServeActorDetails,
    ServeInstanceDetails,
    ServeStatusSchema,
    empty_instance_details,
)

__all__ = [
    "ApplicationDetailsView",
    "DeploymentDetailsView",
    "InstanceDetailsView",
    "ProcessView",
    "ProxyView",
    "ReplicaProcessView",
    "controller_process",
    "details_body",
    "instance_details",
    "single_app_status",
]

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
class InstanceDetailsView:
    """The running serving layer: its controller, REST instance options, proxies by node."""

    controller: ProcessView
    #: the instance-level REST fields (``proxy_location``, ``http_options``...), defaults filled
    options: Mapping[str, Any]
    proxies: Mapping[str, ProxyView] = field(default_factory=dict)
    applications: Sequence[ApplicationDetailsView] = ()


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
            node: ProxyDetails(
                **_process(proxy.process, f"SERVE_PROXY_ACTOR-{node}"), status=proxy.status
            )
            for node, proxy in view.proxies.items()
        },
        applications={app.name: _application(app) for app in view.applications},
        target_capacity=options.get("target_capacity"),
    )


def details_body(details: ServeInstanceDetails) -> dict[str, Any]:
    """The JSON body of GET /api/serve/applications/: the fields the builder set, nothing else."""
    return details.model_dump(mode="json", exclude_unset=True)


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


def _application(app: ApplicationDetailsView) -> ApplicationDetails:
    config = app.config or {}
    imperative = app.api_type == APIType.IMPERATIVE.value
    return ApplicationDetails(
        name=app.name,
        route_prefix=app.route_prefix,
        docs_path=app.docs_path,
        status=app.status,
        message=app.message,
        last_deployed_time_s=app.deployed_at,
        deployed_app_config=None if app.config is None or imperative else dict(app.config),
        source=APIType.IMPERATIVE if imperative else APIType.DECLARATIVE,
        deployments={d.name: _deployment(app.name, d) for d in app.deployments},
        external_scaler_enabled=bool(config.get("external_scaler_enabled", False)),
        deployment_topology=None if app.graph is None else _topology(app.name, app.graph),
    )


def _deployment(app: str, deployment: DeploymentDetailsView) -> DeploymentDetails:
    return DeploymentDetails(
        name=deployment.name,
        status=deployment.status,
        status_trigger=deployment.status_trigger,
        message=deployment.message,
        deployment_config=deployment.config.as_dict(),
        target_num_replicas=deployment.target_replicas,
        required_resources=deployment.config.required_resources(),
        replicas=[
            ReplicaDetails(
                **_process(
                    replica.process,
                    f"SERVE_REPLICA::{app}#{deployment.name}#{replica.replica_id}",
                ),
                replica_id=replica.replica_id,
                state=replica.state,
                pid=replica.pid,
                start_time_s=replica.start_time_s,
            )
            for replica in deployment.replicas
        ],
        autoscaling_detail=(
            None
            if deployment.autoscaling is None
            else DeploymentAutoscalingDetail.model_validate(deployment.autoscaling)
        ),
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
        "actor_id": process.actor_id,
        "actor_name": actor_name,
        "worker_id": process.worker_id,
        "log_file_path": process.log_file_path,
    }
