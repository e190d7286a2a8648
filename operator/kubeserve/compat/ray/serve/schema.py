"""``ray.serve.schema``: the config and status models of Ray Serve 2.60's REST API, as kubeserve's
admin API validates and answers them, and the status types ``serve.status()`` returns.

Where kubeserve's admin API has the model it is that model; the others (``ServeStatus`` and its
overviews, ``ReplicaRank``, ``ControllerHealthMetrics``) carry Ray 2.60's fields and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from pydantic import BaseModel, Field

from kubeserve.compat.ray import not_provided
from kubeserve.schema.config import (
    DeploymentSchema,
    GRPCOptionsSchema,
    HTTPOptionsSchema,
    LoggingConfig,
    RayActorOptionsSchema,
    ServeApplicationSchema,
    ServeDeploySchema,
    TracingConfig,
)
from kubeserve.schema.scaling import ScaleDeploymentRequest
from kubeserve.schema.status import (
    APIType,
    ApplicationDetails,
    ApplicationStatus,
    AutoscalingMetricsHealth,
    AutoscalingStatus,
    DeploymentAutoscalingDetail,
    DeploymentDetails,
    DeploymentNode,
    DeploymentStatus,
    DeploymentStatusTrigger,
    DeploymentTopology,
    ProxyDetails,
    ProxyStatus,
    ReplicaDetails,
    ReplicaState,
    ScalingDecision,
    ServeActorDetails,
    ServeInstanceDetails,
    Target,
    TargetGroup,
)

gRPCOptionsSchema = GRPCOptionsSchema

__all__ = [
    "APIType",
    "ApplicationDetails",
    "ApplicationStatus",
    "ApplicationStatusOverview",
    "AutoscalingMetricsHealth",
    "AutoscalingStatus",
    "ControllerHealthMetrics",
    "DeploymentAutoscalingDetail",
    "DeploymentDetails",
    "DeploymentNode",
    "DeploymentSchema",
    "DeploymentStatus",
    "DeploymentStatusOverview",
    "DeploymentStatusTrigger",
    "DeploymentTopology",
    "DurationStats",
    "EncodingType",
    "HTTPOptionsSchema",
    "LoggingConfig",
    "ProxyDetails",
    "ProxyStatus",
    "RayActorOptionsSchema",
    "ReplicaDetails",
    "ReplicaRank",
    "ReplicaState",
    "ScaleDeploymentRequest",
    "ScalingDecision",
    "ServeActorDetails",
    "ServeApplicationSchema",
    "ServeDeploySchema",
    "ServeInstanceDetails",
    "ServeStatus",
    "Target",
    "TargetGroup",
    "TracingConfig",
    "gRPCOptionsSchema",
]


class EncodingType(str, Enum):  # noqa: UP042 (str() as Ray's: the member name)
    """How a replica writes its log lines (``LoggingConfig.encoding`` takes either string)."""

    TEXT = "TEXT"
    JSON = "JSON"


@dataclass
class DeploymentStatusOverview:
    """One deployment in :class:`ServeStatus`: its status, why, and its replicas by state."""

    status: str
    status_trigger: str
    replica_states: dict[str, int]
    message: str = ""


@dataclass
class ApplicationStatusOverview:
    """One application in :class:`ServeStatus`."""

    status: str
    message: str
    last_deployed_time_s: float
    deployments: dict[str, DeploymentStatusOverview] = field(default_factory=dict)


@dataclass
class ServeStatus:
    """What ``serve.status()`` returns: proxies by node, applications by name."""

    proxies: dict[str, str] = field(default_factory=dict)
    applications: dict[str, ApplicationStatusOverview] = field(default_factory=dict)
    target_capacity: float | None = None


class ReplicaRank(BaseModel):
    """A replica's rank within its deployment: global, its node's, and on its node."""

    rank: int = Field(description="Global rank of the replica scoped to the deployment.")
    node_rank: int = Field(description="Rank of the node in the deployment.")
    local_rank: int = Field(description="Rank of the replica on the node.")


class DurationStats(BaseModel):
    """Statistics of a duration over a rolling window."""

    mean: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0


class ControllerHealthMetrics(BaseModel):
    """The controller's health figures (Ray 2.60's fields, each defaulting to zero or unset)."""

    timestamp: float = 0.0
    controller_start_time: float = 0.0
    uptime_s: float = 0.0
    last_control_loop_time: float = 0.0
    num_control_loops: int = 0
    loop_duration_s: DurationStats | None = None
    loops_per_second: float = 0.0
    last_sleep_duration_s: float = 0.0
    expected_sleep_duration_s: float = 0.0
    event_loop_delay_s: float = 0.0
    num_asyncio_tasks: int = 0
    handle_ingest_duration_ms: DurationStats | None = None
    replica_ingest_duration_ms: DurationStats | None = None
    metrics_decompress_duration_ms: DurationStats | None = None
    columnar_decode_duration_ms: DurationStats | None = None
    handle_reports_received: int = 0
    replica_reports_received: int = 0
    ingest_reports_received: int = 0
    ingest_cpu_fraction: float = 0.0
    deployment_state_update_duration_s: DurationStats | None = None
    application_state_update_duration_s: DurationStats | None = None
    proxy_state_update_duration_s: DurationStats | None = None
    node_update_duration_s: DurationStats | None = None
    handle_metrics_delay_ms: DurationStats | None = None
    replica_metrics_delay_ms: DurationStats | None = None
    process_memory_mb: float = 0.0


__getattr__ = not_provided.module_getattr(__name__)
