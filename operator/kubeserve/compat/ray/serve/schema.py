"""``ray.serve.schema``: the config and status models of Ray Serve 2.60's REST API, as kubeserve's
admin API validates and answers them."""

from __future__ import annotations

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
from kubeserve.schema.status import (
    APIType,
    ApplicationDetails,
    ApplicationStatus,
    DeploymentDetails,
    DeploymentStatus,
    DeploymentStatusTrigger,
    ProxyDetails,
    ProxyStatus,
    ReplicaDetails,
    ReplicaState,
    ServeActorDetails,
    ServeInstanceDetails,
)

gRPCOptionsSchema = GRPCOptionsSchema
EncodingType = str  # Ray's enum of "TEXT" and "JSON"; kubeserve validates the strings

__all__ = [
    "APIType",
    "ApplicationDetails",
    "ApplicationStatus",
    "DeploymentDetails",
    "DeploymentSchema",
    "DeploymentStatus",
    "DeploymentStatusTrigger",
    "EncodingType",
    "HTTPOptionsSchema",
    "LoggingConfig",
    "ProxyDetails",
    "ProxyStatus",
    "RayActorOptionsSchema",
    "ReplicaDetails",
    "ReplicaState",
    "ServeActorDetails",
    "ServeApplicationSchema",
    "ServeDeploySchema",
    "ServeInstanceDetails",
    "TracingConfig",
    "gRPCOptionsSchema",
]
