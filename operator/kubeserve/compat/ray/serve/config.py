"""``ray.serve.config``: the configuration models of Ray Serve 2.60, as kubeserve validates them.

They are the models of the admin API (:mod:`kubeserve.schema.config`), so a value built in code
means exactly what the same value in a config file means. :class:`AutoscalingContext` is what a
custom autoscaling policy is given, with Ray 2.60's attributes (:mod:`kubeserve.sdk.autoscaling`).
"""

from __future__ import annotations

from enum import Enum

from kubeserve.compat.ray import not_provided
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
from kubeserve.sdk.context import DeploymentID, ReplicaID

DeploymentMode = ProxyLocation  # Ray's older name of the same setting

__all__ = [
    "AggregationFunction",
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
    "ReplicaID",
    "RequestRouterConfig",
    "gRPCOptions",
]


class AggregationFunction(str, Enum):  # noqa: UP042 (str() as Ray's: the member name)
    """How an autoscaling metric's samples over the look-back period become one value."""

    MEAN = "mean"
    MAX = "max"
    MIN = "min"


__getattr__ = not_provided.module_getattr(__name__)
