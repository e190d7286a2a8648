"""Response bodies: status values, the single-application status, the instance details.

The Ray 2.60 ``serve`` client parses GET /api/serve/applications/ with strict models: an extra key
at the top level, in an application or in a deployment is rejected, and so is an unknown status
value. These models therefore carry exactly Ray 2.60's field set
(``ServeInstanceDetails`` and what it contains) and forbid anything else; the enums list
exactly Ray's values, so kubeserve cannot report a state the client does not know.

Two fields embed request models and are written out with only the fields that were set:
``ApplicationDetails.deployed_app_config`` ("only the given overrides") and
``DeploymentDetails.deployment_config`` (the controller sets every field it reports; leaving the
rest out keeps nulls the Ray client would reject out of the answer).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    field_serializer,
    model_validator,
)

from kubeserve.schema.config import (
    DeploymentSchema,
    GRPCOptionsSchema,
    HTTPOptionsSchema,
    ProxyLocation,
    ServeApplicationSchema,
)

__all__ = [
    "APIType",
    "ApplicationDetails",
    "ApplicationStatus",
    "ApplicationStatusInfo",
    "AutoscalingMetricsHealth",
    "AutoscalingStatus",
    "DeploymentAutoscalingDetail",
    "DeploymentDetails",
    "DeploymentNode",
    "DeploymentStatus",
    "DeploymentStatusInfo",
    "DeploymentStatusTrigger",
    "DeploymentTopology",
    "ProxyDetails",
    "ProxyStatus",
    "ReplicaDetails",
    "ReplicaState",
    "ReportedDeploymentConfig",
    "RequestProtocol",
    "ScalingDecision",
    "ServeActorDetails",
    "ServeInstanceDetails",
    "ServeStatusSchema",
    "Target",
    "TargetGroup",
    "empty_instance_details",
]


def _is_none(value: object) -> bool:
    return value is None


class _Response(BaseModel):
    """Base of response bodies: exactly the documented fields, nothing else."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- status values


class ApplicationStatus(StrEnum):
    """Lifecycle of an application (Ray 2.60's states, UNHEALTHY included)."""

    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class DeploymentStatus(StrEnum):
    """Health of a deployment as a whole."""

    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


class DeploymentStatusTrigger(StrEnum):
    """What caused a deployment's latest status change."""

    UNSPECIFIED = "UNSPECIFIED"
    CONFIG_UPDATE_STARTED = "CONFIG_UPDATE_STARTED"
    CONFIG_UPDATE_COMPLETED = "CONFIG_UPDATE_COMPLETED"
    UPSCALE_COMPLETED = "UPSCALE_COMPLETED"
    DOWNSCALE_COMPLETED = "DOWNSCALE_COMPLETED"
    AUTOSCALING = "AUTOSCALING"
    REPLICA_STARTUP_FAILED = "REPLICA_STARTUP_FAILED"
    DEPLOYMENT_ACTOR_FAILED = "DEPLOYMENT_ACTOR_FAILED"
    HEALTH_CHECK_FAILED = "HEALTH_CHECK_FAILED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    DELETING = "DELETING"


class ReplicaState(StrEnum):
    """Lifecycle of one replica process."""

    STARTING = "STARTING"
    UPDATING = "UPDATING"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    PENDING_MIGRATION = "PENDING_MIGRATION"


class ProxyStatus(StrEnum):
    """Lifecycle of one HTTP proxy."""

    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


class APIType(StrEnum):
    """How an application was deployed; REST PUTs are ``declarative``."""

    UNKNOWN = "unknown"
    IMPERATIVE = "imperative"
    DECLARATIVE = "declarative"


class AutoscalingStatus(StrEnum):
    """Direction the autoscaler is moving a deployment."""

    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"
    STABLE = "STABLE"


class AutoscalingMetricsHealth(StrEnum):
    """Whether the autoscaler's metrics are fresh."""

    HEALTHY = "healthy"
    DELAYED = "delayed"
    UNAVAILABLE = "unavailable"


class RequestProtocol(StrEnum):
    """Protocol of a target group."""

    UNDEFINED = "UNDEFINED"
    HTTP = "HTTP"
    GRPC = "gRPC"


# ------------------------------------------------------------ GET /api/serve/deployments/status


class ApplicationStatusInfo(_Response):
    """Whether the application is deploying, failed or running, and since when."""

    status: ApplicationStatus
    message: str = ""
    deployment_timestamp: float = 0


class DeploymentStatusInfo(_Response):
    """Status of one deployment of the application."""

    name: str
    status: DeploymentStatus
    message: str = ""


class ServeStatusSchema(_Response):
    """GET /api/serve/deployments/status: one entry per deployment of the graph."""

    name: str = ""
    app_status: ApplicationStatusInfo
    deployment_statuses: list[DeploymentStatusInfo] = Field(default_factory=list)


# ------------------------------------------------------------------ GET /api/serve/applications/


class ServeActorDetails(_Response):
    """A process of the serving layer (the controller; base of proxies and replicas).

    ``serve shutdown`` sends DELETE only when ``node_id`` is non-null.
    """

    node_id: str | None = None
    node_ip: str | None = None
    node_instance_id: str | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    worker_id: str | None = None
    log_file_path: str | None = None


class ProxyDetails(ServeActorDetails):
    """One HTTP proxy, keyed by node id in ``ServeInstanceDetails.proxies``."""

    status: ProxyStatus


class ReplicaDetails(ServeActorDetails):
    """One replica process of a deployment."""

    replica_id: str
    state: ReplicaState
    pid: int | None = None
    start_time_s: float


class ScalingDecision(_Response):
    """One autoscaler decision, kept for display."""

    timestamp_s: float
    reason: str
    prev_num_replicas: NonNegativeInt
    curr_num_replicas: NonNegativeInt
    policy: str | None = None


class DeploymentAutoscalingDetail(_Response):
    """What the autoscaler is doing to a deployment."""

    scaling_status: AutoscalingStatus
    decisions: list[ScalingDecision] = Field(default_factory=list)
    metrics: dict[str, Any] | None = None
    metrics_health: AutoscalingMetricsHealth = AutoscalingMetricsHealth.HEALTHY
    errors: list[str] = Field(default_factory=list)


class ReportedDeploymentConfig(DeploymentSchema):
    """A deployment's ``deployment_config`` as kubeserve reports it: a :class:`DeploymentSchema`
    without the refusals of :mod:`kubeserve.schema.support`, which are about what a client asks
    for. kubeserve reports what it does, its rollout (``rolling_update_percentage``,
    ``max_surge_percent``) included, the backend's own when the config sets neither."""

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> Self:
        return self


class DeploymentDetails(_Response):
    """One deployment: status, effective config, replicas. Every Ray-required field is required."""

    name: str
    status: DeploymentStatus
    status_trigger: DeploymentStatusTrigger
    message: str
    deployment_config: ReportedDeploymentConfig
    target_num_replicas: NonNegativeInt
    required_resources: dict[str, float]
    replicas: list[ReplicaDetails]
    recent_dead_replicas: list[ReplicaDetails] = Field(default_factory=list)
    autoscaling_detail: DeploymentAutoscalingDetail | None = None

    @field_serializer("deployment_config")
    def _set_fields_only(self, config: ReportedDeploymentConfig) -> dict[str, Any]:
        return config.as_given()


class DeploymentNode(_Response):
    """A deployment in the application graph and the deployments it calls."""

    name: str
    app_name: str
    outbound_deployments: list[dict[str, Any]] = Field(default_factory=list)
    is_ingress: bool = False


class DeploymentTopology(_Response):
    """The application graph: which deployment calls which."""

    app_name: str
    nodes: dict[str, DeploymentNode]
    ingress_deployment: str | None = None


class ApplicationDetails(_Response):
    """One application in GET /api/serve/applications/.

    ``deployed_app_config`` is left out when there is none (a custom resource whose spec breaks a
    REST rule), ``deployment_topology`` while the graph is not built.
    """

    name: str
    route_prefix: str | None
    docs_path: str | None
    status: ApplicationStatus
    message: str
    last_deployed_time_s: float
    deployed_app_config: ServeApplicationSchema | None = Field(default=None, exclude_if=_is_none)
    source: APIType
    deployments: dict[str, DeploymentDetails]
    external_scaler_enabled: bool
    deployment_topology: DeploymentTopology | None = Field(default=None, exclude_if=_is_none)

    @field_serializer("deployed_app_config")
    def _given_only(self, config: ServeApplicationSchema | None) -> dict[str, Any] | None:
        return None if config is None else config.as_given()


class Target(_Response):
    """An address that serves a route (used by external load balancers)."""

    ip: str
    port: int
    instance_id: str
    name: str


class TargetGroup(_Response):
    """The targets serving one route prefix over one protocol."""

    targets: list[Target]
    route_prefix: str
    protocol: RequestProtocol
    app_name: str = ""
    ingress_request_router_targets: list[Target] = Field(default_factory=list)
    ingress_deployment_name: str = ""


class ServeInstanceDetails(_Response):
    """GET /api/serve/applications/: the serving layer and every application.

    ``controller_health_metrics`` is Ray's internal controller telemetry; kubeserve keeps it an
    opaque object and leaves it out of the answer when it has none (Ray's client does not accept a
    null there).
    """

    controller_info: ServeActorDetails = Field(default_factory=ServeActorDetails)
    proxy_location: ProxyLocation | None = None
    http_options: HTTPOptionsSchema | None = None
    grpc_options: GRPCOptionsSchema | None = None
    proxies: dict[str, ProxyDetails]
    applications: dict[str, ApplicationDetails]
    target_capacity: Annotated[float, Field(ge=0, le=100)] | None = None
    target_groups: list[TargetGroup] = Field(default_factory=list)
    controller_health_metrics: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    restores_unset_config_options: bool = False


def empty_instance_details() -> ServeInstanceDetails:
    """The answer when the serving layer is not running: what Ray sends, with the fields set that
    Ray writes (dumped with ``exclude_unset``, it is Ray's body byte for byte).

    ``controller_info`` has no ``node_id``, which tells ``serve shutdown`` there is nothing to
    shut down.
    """
    return ServeInstanceDetails(
        controller_info=ServeActorDetails(), proxies={}, applications={}, target_capacity=None
    )
