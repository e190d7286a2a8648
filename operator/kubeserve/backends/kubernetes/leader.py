"""Leader election of the operator's replicas on one ``coordination.k8s.io/v1`` Lease.

Every replica serves the admin API and keeps its caches; only the leader reconciles (runs kopf
and the reconcile worker, see :mod:`.main`). The decisions are in
:mod:`kubeserve.control.leader_election`; this module reads and writes the Lease every retry
period and publishes the outcome:

* :attr:`LeaderElector.leading` is set while this process leads, :attr:`LeaderElector.lost` when
  a term ended (renewal failed for ``renew_deadline``, or another holder was seen);
* :meth:`LeaderElector.may_write` is the fence of the reconcilers' client
  (:meth:`~kubeserve.runtime.kubernetes.client.Kube.fenced`): false from the moment the term may
  have ended, which is before any other replica may take the Lease;
* :attr:`LeaderElector.leader_url` is the admin URL of the current leader (from the Lease), where
  the other replicas forward what only the leader uses.

The elector uses its own client (its own connections), so a renewal never queues behind a
reconcile pass's requests, and Lease traffic is not counted in the operator's API figures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubeserve.control.leader_election import (
    LEADER_URL_ANNOTATION,
    LeaseRecord,
    LeaseTiming,
    Observation,
    Tenure,
    claim,
    release,
)
from kubeserve.runtime.kubernetes.client import Kube, KubeConflict, KubeError

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


def micro_time() -> str:
    """Now as a Lease's ``MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        leader_url: str,
        timing: LeaseTiming,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity, self.timing, self._clock = identity, timing, clock
        self._own_url = leader_url
        self._tenure = Tenure(timing)
        self._observed: Observation | None = None
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        #: the current leader's admin URL as the Lease says ("" when unknown or nobody leads)
        self.leader_url = ""
        #: terms this process started, for the metrics
        self.terms = 0

    def may_write(self) -> bool:
        """Whether this process still leads for certain (see :class:`~.leader_election.Tenure`)."""
        return self._tenure.may_write(self._clock())

    async def run(self) -> None:
        """Try to take or renew the Lease every retry period, until cancelled."""
        while True:
            started = self._clock()
            try:
                held = await asyncio.wait_for(self._attempt(), self.timing.renew_deadline_s)
            except (KubeError, OSError, TimeoutError) as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                held = False
            if held:
                self._tenure.renewed(started)
                if not self.leading.is_set():
                    self._start_term()
            elif self.leading.is_set() and not self.may_write():
                self._end_term("could not renew the lease within the renew deadline")
            await asyncio.sleep(max(0.0, started + self.timing.retry_period_s - self._clock()))

    async def release(self) -> None:
        """End this process's term and empty the Lease (a clean stop: the next replica takes
        over at its next attempt); best effort, bounded by one retry period."""
        if not self.leading.is_set():
            return
        self._end_term("stopping")
        try:
            lease = await asyncio.wait_for(
                self.kube.get("Lease", self.namespace, self.name), self.timing.retry_period_s
            )
            if lease is not None and LeaseRecord.of(lease).holder == self.identity:
                record = release(LeaseRecord.of(lease), micro_time())
                await asyncio.wait_for(
                    self.kube.replace(self._lease(record, lease)), self.timing.retry_period_s
                )
        except (KubeError, OSError, TimeoutError) as exc:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, exc)

    async def _attempt(self) -> bool:
        """One read and, unless another replica holds the Lease, one compare-and-swap write.
        What it read counts as observed when the read *returned* (the later, safer time)."""
        lease = await self.kube.get("Lease", self.namespace, self.name)
        now = self._clock()
        current = LeaseRecord() if lease is None else LeaseRecord.of(lease)
        observed = (
            self._observed.seen(current, now) if self._observed else Observation(current, now)
        )
        self._observed = observed
        self.leader_url = current.leader_url if current.holder else ""
        if observed.held_by_another(self.identity, self.timing, now):
            if self.leading.is_set():
                self._end_term(f"the lease is held by {current.holder}")
            return False
        wanted = claim(current, self.identity, self._own_url, self.timing, micro_time())
        try:
            if lease is None:
                await self.kube.create("Lease", self.namespace, self._lease(wanted, None))
            else:
                await self.kube.replace(self._lease(wanted, lease))
        except KubeConflict:
            return False  # another replica wrote first; the next attempt reads its record
        self._observed = Observation(wanted, now)
        self.leader_url = self._own_url
        return True

    def _lease(self, record: LeaseRecord, current: dict[str, Any] | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
            annotations = dict(current["metadata"].get("annotations") or {})
        else:
            annotations = {}
        annotations[LEADER_URL_ANNOTATION] = record.leader_url
        metadata["annotations"] = annotations
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.spec(),
        }

    def _start_term(self) -> None:
        self.terms += 1
        self.lost.clear()
        self.leading.set()
        log.info("leading: holding lease %s/%s as %s", self.namespace, self.name, self.identity)

    def _end_term(self, why: str) -> None:
        self._tenure.end()
        self.leading.clear()
        self.lost.set()
        log.warning("no longer leading (%s)", why)
