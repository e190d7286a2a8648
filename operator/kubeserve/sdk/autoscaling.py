"""What a custom autoscaling policy is called with: Ray Serve 2.60's ``AutoscalingContext``.

A policy (``autoscaling_config.policy.policy_function``, or an application's
``autoscaling_policy``) is user code: kubeserve calls it in a process of the application's own
environment (:mod:`kubeserve.runtime.autoscaling_policy`), never in the controller. That process
builds one :class:`AutoscalingContext` per deployment from what the controller measured.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from kubeserve.sdk.context import DeploymentID, ReplicaID

__all__ = ["AutoscalingContext"]


class AutoscalingContext:
    """A deployment's state as its autoscaling policy sees it (Ray 2.60's attributes).

    ``total_num_requests`` is the running plus queued requests aggregated over
    ``look_back_period_s`` with the deployment's ``aggregation_function``; ``policy_state`` is
    the dict the policy returned last time (empty at first), kept between calls for as long as
    the policy process lives. kubeserve has no custom autoscaling metrics, so
    ``aggregated_metrics`` and ``raw_metrics`` are empty.

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
        config: Any,
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

    def __repr__(self) -> str:
        return (
            f"AutoscalingContext(deployment_id={self.deployment_id!r}, "
            f"current_num_replicas={self.current_num_replicas}, "
            f"target_num_replicas={self.target_num_replicas}, "
            f"total_num_requests={self.total_num_requests})"
        )


def _value(given: Any) -> Any:
    return given() if callable(given) else given
