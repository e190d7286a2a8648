"""``ray.serve.config``: the configuration models of Ray Serve 2.60, as kubeserve validates them.

They are the models of the admin API (:mod:`kubeserve.schema.config`), so a value built in code
means exactly what the same value in a config file means. :class:`AutoscalingContext` is what a
custom autoscaling policy is given, with Ray 2.60's attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from functools import cached_property
from typing import Any

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


def _value(given: Any) -> Any:
    return given() if callable(given) else given


class AutoscalingContext:
    """What a custom autoscaling policy is given: the deployment, its replicas, the requests it
    holds, its bounds, the policy's own state, and the time.

    ``total_num_requests``, ``total_queued_requests``, ``aggregated_metrics`` and ``raw_metrics``
    may be given as callables, evaluated once on first access (as Ray's are).
    """

    def __init__(
        self,
        deployment_id: DeploymentID,
        deployment_name: str,
        app_name: str | None,
        current_num_replicas: int,
        target_num_replicas: int,
        running_replicas: list[ReplicaID],
        total_num_requests: float | Callable[[], float],
        total_queued_requests: float | Callable[[], float] | None,
        aggregated_metrics: Any,
        raw_metrics: Any,
        capacity_adjusted_min_replicas: int,
        capacity_adjusted_max_replicas: int,
        policy_state: dict[str, Any],
        last_scale_up_time: float | None,
        last_scale_down_time: float | None,
        current_time: float | None,
        config: Any | None,
    ) -> None:
        self.deployment_id = deployment_id
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.current_num_replicas = current_num_replicas
        self.target_num_replicas = target_num_replicas
        self.running_replicas = running_replicas
        self._total_num_requests = total_num_requests
        self._total_queued_requests = total_queued_requests
        self._aggregated_metrics = aggregated_metrics
        self._raw_metrics = raw_metrics
        self.capacity_adjusted_min_replicas = capacity_adjusted_min_replicas
        self.capacity_adjusted_max_replicas = capacity_adjusted_max_replicas
        self.policy_state = policy_state
        self.last_scale_up_time = last_scale_up_time
        self.last_scale_down_time = last_scale_down_time
        self.current_time = current_time
        self.config = config

    @cached_property
    def aggregated_metrics(self) -> Any:
        return _value(self._aggregated_metrics)

    @cached_property
    def raw_metrics(self) -> Any:
        return _value(self._raw_metrics)

    @cached_property
    def total_num_requests(self) -> float:
        return float(_value(self._total_num_requests))

    @cached_property
    def total_queued_requests(self) -> float:
        return float(_value(self._total_queued_requests) or 0.0)

    @property
    def total_running_requests(self) -> float:
        """Requests running on replicas: the ongoing ones less those queued at handles."""
        return max(0.0, self.total_num_requests - self.total_queued_requests)


__getattr__ = not_provided.module_getattr(__name__)
