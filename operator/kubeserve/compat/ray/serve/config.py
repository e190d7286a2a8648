"""``ray.serve.config``: the configuration models of Ray Serve 2.60, as kubeserve validates them.

They are the models of the admin API (:mod:`kubeserve.schema.config`), so a value built in code
means exactly what the same value in a config file means.
"""

from __future__ import annotations

from kubeserve.schema.config import (
    AutoscalingConfig,
    AutoscalingPolicy,
    BackpressureConfig,
    ControllerOptions,
    DeploymentActorConfig,
    GangSchedulingConfig,
    ProxyLocation,
    RequestRouterConfig,
)
from kubeserve.schema.config import GRPCOptionsSchema as gRPCOptions
from kubeserve.schema.config import HTTPOptionsSchema as HTTPOptions
from kubeserve.sdk.autoscaling import AutoscalingContext
from kubeserve.sdk.context import DeploymentID

DeploymentMode = ProxyLocation  # Ray's older name of the same setting

__all__ = [
    "AutoscalingConfig",
    "AutoscalingContext",
    "AutoscalingPolicy",
    "BackpressureConfig",
    "ControllerOptions",
    "DeploymentActorConfig",
    "DeploymentID",
    "DeploymentMode",
    "GangSchedulingConfig",
    "HTTPOptions",
    "ProxyLocation",
    "RequestRouterConfig",
    "gRPCOptions",
]
