"""Leader election of the operator's replicas on one ``coordination.k8s.io/v1`` Lease.

Every replica serves the admin API and keeps its caches; only the leader reconciles (runs kopf
and the reconcile worker, see :mod:`.main`). The decisions are in
:mod:`kubeserve.control.leader_election`; this module reads and writes the Lease every retry
period and publishes the outcome:

* :attr:`LeaderElector.leading` is set while this process leads, :attr:`LeaderElector.lost` when
  a term ended (no renewal succeeded for ``lease_duration``, or another holder was seen);
* :meth:`LeaderElector.may_write` is the fence of the reconcilers' client
  (:meth:`~kubeserve.runtime.kubernetes.client.Kube.fenced`): false from the moment the term may
  have ended, which is before any other replica may take the Lease, and meanwhile while a
  renewal is late (the writes pause; the term goes on, see
  :class:`~kubeserve.control.leader_election.TermState`);
* an attempt (a renewal, during a term) goes out every retry period, even while earlier ones are
  unanswered (at most :data:`~kubeserve.control.leader_election.RENEWALS_IN_FLIGHT`): an API
  server answering in seconds keeps the fence open with its freshest answer;
* :attr:`LeaderElector.leader_url` is the admin URL of the current leader (from the Lease), where
  the other replicas forward what only the leader uses.

The elector runs in a thread of its own, with its own event loop and its own client (its own
connections): a renewal never waits for the operator's loop, however busy a thousand reconcile
passes keep it, nor queues behind their requests, and Lease traffic is not counted in the
operator's API figures. Across the two threads: :meth:`LeaderElector.may_write` reads the tenure
(one attribute, written by the elector's thread), and the start and end of a term reach
:attr:`~LeaderElector.leading` and :attr:`~LeaderElector.lost`, events of the operator's loop,
through that loop (in the order they happened). The fence does not depend on that delivery: the
moment a term may have ended, ``may_write`` says so in every thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubeserve.control.leader_election import (
    LEADER_URL_ANNOTATION,
    RENEWALS_IN_FLIGHT,
    LeaseRecord,
    LeaseTiming,
    Observation,
    Tenure,
    TermState,
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
    """Takes and renews the Lease from its own thread (see the module) between :meth:`start`
    and :meth:`stop`, both called from the operator's loop."""

    def __init__(
        self,
        kubeconfig: str | None,
        namespace: str,
        name: str,
        identity: str,
        leader_url: str,
        timing: LeaseTiming,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kubeconfig, self.namespace, self.name = kubeconfig, namespace, name
        self.identity, self.timing, self._clock = identity, timing, clock
        self._own_url = leader_url
        self._tenure = Tenure(timing)
        self._observed: Observation | None = None
        #: the elector's client, in its thread (set there by :meth:`start`)
        self.kube: Kube | None = None
        #: events of the operator's loop (made by :meth:`start`)
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        #: the current leader's admin URL as the Lease says ("" when unknown or nobody leads)
        self.leader_url = ""
        #: terms this process started, for the metrics
        self.terms = 0
        self._owner: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        #: whether a term is in progress, as the elector's thread knows it
        self._in_term = False

    def may_write(self) -> bool:
        """Whether this process still leads for certain (see :class:`~.leader_election.Tenure`);
        safe from any thread."""
        return self._tenure.may_write(self._clock())

    async def start(self) -> None:
        """Connect the elector's client and start campaigning in its thread."""
        self._owner = asyncio.get_running_loop()
        connected: asyncio.Future[None] = self._owner.create_future()
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._serve(connected),),
            name=f"lease {self.namespace}/{self.name}",
            daemon=True,
        )
        self._thread.start()
        await connected

    async def stop(self) -> None:
        """Stop campaigning and release the Lease when this process leads (best effort, bounded
        by one retry period), then end the thread."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop ended already
                loop.call_soon_threadsafe(stopping.set)
        await asyncio.to_thread(thread.join, 2 * self.timing.retry_period_s + 5)
        self._thread = None

    async def _serve(self, connected: asyncio.Future[None]) -> None:
        """The elector's thread: connect, campaign until :meth:`stop`, release, close."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            self.kube = await Kube.connect(self._kubeconfig)
        except BaseException as exc:
            self._to_owner(_settle, connected, exc)
            raise
        self._to_owner(_settle, connected, None)
        campaign = asyncio.ensure_future(self.run())
        try:
            await self._stopping.wait()
        finally:
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign
            await self._release()
            await self.kube.close()

    def _to_owner(self, callback: Callable[..., object], *args: object) -> None:
        assert self._owner is not None
        with contextlib.suppress(RuntimeError):  # the operator's loop is closed: nobody waits
            self._owner.call_soon_threadsafe(callback, *args)

    @property
    def fence_shuts(self) -> int:
        """Times the fence shut for a late renewal (counted when the pause ended)."""
        return self._tenure.fence_shuts

    async def run(self) -> None:
        """Send an attempt to take or renew the Lease every retry period (unless
        :data:`~kubeserve.control.leader_election.RENEWALS_IN_FLIGHT` are unanswered), and end
        the term when none succeeded for ``lease_duration``; until cancelled (in the elector's
        thread)."""
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while True:
                started = self._clock()
                if len(in_flight) < RENEWALS_IN_FLIGHT:
                    attempt = asyncio.ensure_future(self._try(started))
                    in_flight.add(attempt)
                    attempt.add_done_callback(in_flight.discard)
                if self._in_term and self._tenure.state(self._clock()) is TermState.ENDED:
                    self._end_term("no renewal of the lease succeeded for its duration")
                await asyncio.sleep(max(0.0, started + self.timing.retry_period_s - self._clock()))
        finally:
            for attempt in list(in_flight):
                attempt.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def _try(self, started: float) -> None:
        """One attempt, sent at ``started``; its success counts unless the term it was sent in
        ended meanwhile (an answer later than ``lease_duration`` counts for nothing)."""
        epoch = self._tenure.epoch
        try:
            held = await asyncio.wait_for(self._attempt(), self.timing.lease_duration_s)
        except (KubeError, OSError, TimeoutError) as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return
        if held and self._tenure.renewed(started, self._clock(), epoch) and not self._in_term:
            self._start_term()

    async def _release(self) -> None:
        """End this process's term and empty the Lease (a clean stop: the next replica takes
        over at its next attempt); best effort, bounded by one retry period (in the elector's
        thread)."""
        if not self._in_term or self.kube is None:
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
        """During a term, one renewal (:meth:`_renew`: one request, and the API server of a
        busy cluster may take seconds for each); else, or when the Lease no longer names this
        process, one read and, unless another replica holds it, one compare-and-swap write. What
        it read counts as observed when the read *returned* (the later, safer time)."""
        assert self.kube is not None
        if self._in_term and await self._renew():
            return True
        lease = await self.kube.get("Lease", self.namespace, self.name)
        now = self._clock()
        current = LeaseRecord() if lease is None else LeaseRecord.of(lease)
        observed = (
            self._observed.seen(current, now) if self._observed else Observation(current, now)
        )
        self._observed = observed
        self.leader_url = current.leader_url if current.holder else ""
        if observed.held_by_another(self.identity, self.timing, now):
            if self._in_term:
                self._end_term(f"the lease is held by {current.holder}")
            return False
        return await self._write(current, lease)

    async def _renew(self) -> bool:
        """One JSON patch of the Lease's renew time that the API server applies only while the
        Lease still names this process (a ``test`` of the holder, atomic with the change): not a
        compare-and-swap over a resourceVersion, so that renewals in flight at once do not
        refuse one another; as safe, since another replica takes the Lease only after it did not
        change for its duration, when this one's fence has shut already. False when the Lease
        no longer names this process (the read that follows says who holds it)."""
        assert self.kube is not None
        operations = [
            {"op": "test", "path": "/spec/holderIdentity", "value": self.identity},
            {"op": "replace", "path": "/spec/renewTime", "value": micro_time()},
        ]
        try:
            await self.kube.json_patch("Lease", self.namespace, self.name, operations)
        except KubeError as exc:  # the test failed (422), the Lease is gone (404), or worse
            log.debug("renewal of lease %s/%s refused: %s", self.namespace, self.name, exc)
            return False
        return True

    async def _write(self, current: LeaseRecord, lease: dict[str, Any] | None) -> bool:
        """Take the Lease (or renew it after a failed :meth:`_renew`) over ``lease`` (None:
        there is none); False when another wrote it first (the next attempt reads its
        record)."""
        assert self.kube is not None
        sent = self._clock()
        wanted = claim(current, self.identity, self._own_url, self.timing, micro_time())
        try:
            if lease is None:
                await self.kube.create("Lease", self.namespace, self._lease(wanted, None))
            else:
                await self.kube.replace(self._lease(wanted, lease))
        except KubeConflict:
            return False
        self._observed = Observation(wanted, sent)
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
        self._in_term = True
        self._to_owner(_publish, self.leading, self.lost)
        log.info("leading: holding lease %s/%s as %s", self.namespace, self.name, self.identity)

    def _end_term(self, why: str) -> None:
        self._tenure.end(self._clock())  # the fence first: from now on no thread may write
        self._in_term = False
        self._to_owner(_publish, self.lost, self.leading)
        log.warning("no longer leading (%s)", why)


def _publish(now: asyncio.Event, before: asyncio.Event) -> None:
    """A term started (``leading``, ``lost``) or ended (``lost``, ``leading``), in the
    operator's loop."""
    before.clear()
    now.set()


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
