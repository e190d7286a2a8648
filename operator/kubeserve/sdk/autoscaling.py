"""What a custom autoscaling policy is called with: Ray Serve 2.60's ``AutoscalingContext``.

A policy (``autoscaling_config.policy.policy_function``, or an application's
``autoscaling_policy``) is user code: kubeserve calls it in a process of the application's own
environment (:mod:`kubeserve.runtime.autoscaling_policy`), never in the controller. That process
builds one :class:`AutoscalingContext` per deployment from what the controller measured.
"""

from __future__ import annotations

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
    """

    def __init__(
        self,
        deployment_id: DeploymentID,
        deployment_name: str,
        app_name: str | None,
        current_num_replicas: int,
        target_num_replicas: int,
        running_replicas: list[ReplicaID],
        total_num_requests: float,
        total_queued_requests: float | None,
        aggregated_metrics: dict[str, dict[ReplicaID, float]] | None,
        raw_metrics: dict[str, dict[ReplicaID, Any]] | None,
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
        self.total_num_requests = total_num_requests
        self.total_queued_requests = total_queued_requests
        self.aggregated_metrics = aggregated_metrics
        self.raw_metrics = raw_metrics
        self.capacity_adjusted_min_replicas = capacity_adjusted_min_replicas
        self.capacity_adjusted_max_replicas = capacity_adjusted_max_replicas
        self.policy_state = policy_state
        self.last_scale_up_time = last_scale_up_time
        self.last_scale_down_time = last_scale_down_time
        self.current_time = current_time
        self.config = config

    def __repr__(self) -> str:
        return (
            f"AutoscalingContext(deployment_id={self.deployment_id!r}, "
            f"current_num_replicas={self.current_num_replicas}, "
            f"target_num_replicas={self.target_num_replicas}, "
            f"total_num_requests={self.total_num_requests})"
        )
