"""Autoscaling on the local machine: how many replicas one deployment wants.

The local counterpart of :mod:`kubeserve.backends.kubernetes.autoscaling`: the decisions are
:class:`~kubeserve.control.autoscaling_state.DeploymentAutoscaler`'s (the same on both backends);
this module reads every running replica's ``/-/metrics`` over the authenticated channel every
``metrics_interval_s``, hears the callers' reports of queued requests, and wakes the controller when
a target changed. Owns, per deployment, the autoscaler, the instance's ``target_capacity`` as the
deployment sees it, and the count set through the external scaling API; :attr:`target` is the one
answer its :class:`~kubeserve.backends.local.deployment_state.DeploymentState` reconciles to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubeserve.backends.local.policy_process import PolicyProcess
from kubeserve.backends.local.replica_process import ReplicaProcess
from kubeserve.control.autoscaling import Direction
from kubeserve.control.autoscaling_state import (
    DeploymentAutoscaler,
    PolicyMember,
    PolicyOutcome,
    ReplicaLoad,
    ask_policy,
)
from kubeserve.control.effective_config import EffectiveDeployment

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = 5.0


class DeploymentScaling:
    """The replica count one deployment wants: autoscaled, set externally, or fixed."""

    def __init__(
        self, label: str, running: Callable[[], list[ReplicaProcess]], wake: Callable[[], None]
    ) -> None:
        """``running``: the deployment's serving replicas; ``wake``: the controller's wake-up."""
        self._label = label
        self._running = running
        self._wake = wake
        self._config = EffectiveDeployment("")
        #: the instance's ``target_capacity`` and its direction (see :mod:`control.autoscaling`)
        self.target_capacity: float | None = None
        self.capacity_direction: Direction | None = None
        #: owns the target of an autoscaling deployment (``None`` for a fixed count)
        self.autoscaler: DeploymentAutoscaler | None = None
        #: the count set through the external scaling API (``external_scaler_enabled``)
        self.external_target: int | None = None
        #: asks the application's policy process (set by the application; see
        #: :mod:`~kubeserve.backends.local.policy_process`)
        self.policy_process: PolicyProcess | None = None
        #: decides for every autoscaling deployment of the application at once, when the
        #: application has an ``autoscaling_policy`` (set by the application)
        self.application_policy: Callable[[], Awaitable[None]] | None = None
        self._reading_metrics = False

    @property
    def target(self) -> int:
        if self.autoscaler is not None:
            return self.autoscaler.target
        if self.external_target is not None:
            return self.external_target
        return self._config.target_replicas(self.target_capacity)

    def set_config(self, config: EffectiveDeployment) -> None:
        self._config = config
        self._configure()

    def set_capacity(self, target_capacity: float | None, direction: Direction | None) -> None:
        self.target_capacity, self.capacity_direction = target_capacity, direction
        self._configure()

    def adopt(self, running_count: int) -> None:
        """Start from the count of replicas an earlier run left (within the bounds)."""
        if self.autoscaler is not None:
            self.autoscaler.adopt(running_count)

    def _configure(self) -> None:
        raw = self._config.autoscaling_config
        now = time.time()
        if not raw:
            self.autoscaler = None
        elif self.autoscaler is None:
            self.autoscaler = DeploymentAutoscaler(
                raw, now, self.target_capacity, self.capacity_direction
            )
        else:
            self.autoscaler.reconfigure(raw, now, self.target_capacity, self.capacity_direction)

    def due(self, now: float) -> bool:
        """Whether it is time to read the replicas' load and decide again."""
        scaler = self.autoscaler
        return scaler is not None and not self._reading_metrics and now >= scaler.next_read_at

    async def read_and_decide(self) -> None:
        """Read every running replica's load, decide, and wake the controller on a change."""
        scaler = self.autoscaler
        if scaler is None:
            return
        self._reading_metrics = True
        scaler.next_read_at = time.time() + scaler.config.metrics_interval_s
        try:
            running = self._running()
            loads = await asyncio.gather(*(_read_load(r) for r in running))
            now = time.time()
            for replica, load in zip(running, loads, strict=True):
                if load is not None:
                    scaler.record_replica(replica.replica_id, load, now)
            scaler.forget_replicas(r.replica_id for r in running)
            if self.application_policy is not None:
                await self.application_policy()
            elif scaler.policy is not None:
                await self._ask_policy(scaler, scaler.policy)
            else:
                self._decide(now)
        finally:
            self._reading_metrics = False

    def policy_member(self) -> PolicyMember | None:
        """This deployment as a custom policy sees it (None: it does not autoscale)."""
        if self.autoscaler is None:
            return None
        running = self._running()
        return PolicyMember(self.autoscaler, len(running), [r.replica_id for r in running])

    def announce(self) -> None:
        """The target changed: say why and wake the controller."""
        assert self.autoscaler is not None
        log.info("%s: %s", self._label, self.autoscaler.decisions[-1].reason)
        self._wake()

    async def _ask_policy(self, scaler: DeploymentAutoscaler, policy: dict[str, Any]) -> None:
        if self.policy_process is None:
            scaler.policy_failed("no policy process for this application")
            return
        member = self.policy_member()
        assert member is not None
        outcome: PolicyOutcome = await ask_policy(
            self.policy_process.ask, "deployment", policy, {self._config.name: member}, time.time
        )
        if outcome.error:
            log.warning("%s: %s", self._label, scaler.policy_error)
        if outcome.changed:
            self.announce()

    def record_queued(self, caller_id: str, queued: int) -> None:
        """A caller's report of requests waiting for this deployment (see
        :mod:`kubeserve.runtime.load_report`); a request waiting on zero replicas decides now."""
        scaler = self.autoscaler
        if scaler is None:
            return
        now = time.time()
        scaler.record_queued(caller_id, queued, now)
        if queued and not self._running():
            self._decide(now)

    def _decide(self, now: float) -> None:
        assert self.autoscaler is not None
        before = self.autoscaler.target
        self.autoscaler.step(len(self._running()), now)
        self._after_decision(before)

    def _after_decision(self, before: int) -> None:
        assert self.autoscaler is not None
        if self.autoscaler.target != before:
            self.announce()


async def _read_load(replica: ReplicaProcess) -> ReplicaLoad | None:
    samples = await replica.read_metrics(_READ_TIMEOUT_S)
    return None if samples is None else ReplicaLoad.from_metrics(samples)
