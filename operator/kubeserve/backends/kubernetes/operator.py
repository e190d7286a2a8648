"""The operator process: caches, reconcilers and kopf, in one asyncio loop.

Ownership: the :class:`Operator` owns one lock per custom resource, so two passes over the same
object never overlap, and builds the pieces each pass uses, each with one job:
:class:`~.cluster.Cluster` (the API client, the caches, writes of what changed),
:class:`~.data_plane.DataPlane` (each instance's secret and user_config pushes; it wakes the
operator through the callback it was built with) and one reconciler per kind. kopf delivers
custom-resource events; changes of owned objects arrive through the caches and mark the custom
resources of their namespace dirty; a worker reconciles dirty objects from the cache. Either path
runs the same idempotent pass.

One pass, for an application (an instance takes the same route through ``instance.py``):

1. :meth:`Operator.reconcile` takes the object's lock and reads its latest version;
2. :meth:`~.application.ApplicationReconciler.reconcile` validates the spec and finds the
   instance (or returns :class:`~.reports.ApplicationRefused`), then converges the build Job, the
   graph and each deployment's workload and Service through :class:`~.cluster.Cluster` and the
   pure renderer, and pushes user_config through :class:`~.data_plane.DataPlane`;
3. it returns a typed report (:class:`~.reports.ApplicationReport`), whose ``patch`` in
   ``status.py`` is the only code spelling status fields;
4. :meth:`~.cluster.Cluster.patch_status` writes it when it changed (and announces a failure),
   at once unless it only moves the progress of a status just written: then a pass writes it a
   moment later (:mod:`kubeserve.control.status_pacing`).

Four steps through four files (operator, application, status, cluster), plus the data plane for
the secret and the pushes.

With several replicas of the operator, every one keeps the caches (the admin API reads them) and
only the leader reconciles: :meth:`Operator.lead` starts the worker, :meth:`Operator.follow` stops
it, and every write of a pass goes through a client fenced by ``may_write`` (the leader's Lease,
:mod:`.leader`), so a pass still running when the term ends writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubeserve.backends.kubernetes.application import ApplicationReconciler
from kubeserve.backends.kubernetes.autoscaling import Autoscalers, scaling_key
from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.kubernetes.cluster import Cluster
from kubeserve.backends.kubernetes.concerns import CUSTOM_KINDS, concerned, inputs_digest, key_of
from kubeserve.backends.kubernetes.data_plane import DataPlane
from kubeserve.backends.kubernetes.instance import InstanceReconciler
from kubeserve.backends.kubernetes.leader import LeaderElector
from kubeserve.backends.kubernetes.metrics import metrics_text
from kubeserve.backends.kubernetes.reports import ApplicationReport, StatusReport
from kubeserve.control import status_pacing
from kubeserve.control.autoscaling_state import CallerReports
from kubeserve.control.leader_election import LeaseTiming
from kubeserve.control.resync_turns import ResyncTurns
from kubeserve.runtime import wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeError, KubeFenced
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorSettings:
    """Settings of ``kubeserve operator``, built once by the CLI from its flags and environment
    (the process reads neither anywhere else)."""

    #: the operator's own namespace (the admin API creates custom resources here)
    namespace: str
    #: namespaces to watch; empty means the whole cluster
    watch_namespaces: tuple[str, ...] = ()
    kubeconfig: str | None = None
    #: the operator's admin server as pods reach it, for their load reports (scale to zero)
    report_url: str | None = None
    #: the proxies' data path for a ServeInstance whose ``spec.proxy.dataPath`` is unset
    proxy_data_path: DataPath = DEFAULT_DATA_PATH
    #: ``--node-local-sockets auto`` (:attr:`DataPlane.node_sockets_auto`)
    node_sockets_auto: bool = True
    #: the addresses the admin server (and the metrics listener) listen on
    admin_hosts: tuple[str, ...] = ("0.0.0.0",)
    admin_port: int = 8265
    #: the port of the Prometheus ``/metrics`` listener; 0: none
    metrics_port: int = 0
    #: leader election among the operator's replicas; None: this process always reconciles
    election: ElectionSettings | None = None


@dataclass(frozen=True)
class ElectionSettings:
    """Leader election on the Lease ``lease_name`` in the operator's namespace."""

    #: this replica's name in the Lease's ``holderIdentity`` (unique per process)
    identity: str
    #: this replica's admin server as the other replicas reach it (they forward load reports)
    advertise_url: str
    lease_name: str = "kubeserve-operator"
    timing: LeaseTiming = field(default_factory=LeaseTiming)


class Reconciler(Protocol):
    """One kind of custom resource: converge an object's children, report its status."""

    async def reconcile(self, obj: dict[str, Any]) -> StatusReport: ...


#: Reconcile passes in flight at once (the worker's and kopf's handlers' together). Each is a
#: chain of API requests, each taking up to a second from a busy API server: the passes of a bulk
#: apply overlap to keep it busy, but a thousand at once would only queue at it and in the event
#: loop. The rest wait their turn, in order. (The leader's Lease does not wait for them: it is
#: renewed from a thread of its own.) A pass writes its deployments' objects at once, so the
#: API client's connection pool (100) is what bounds the requests in flight; a pass that writes
#: nothing (most of a roll-out's: a pod's progress, paced) holds its turn for no round trip.
CONCURRENT_PASSES = 64

#: The operator's writes in flight at once (the passes', the admin API's). The passes write
#: their objects at once, and sixty-four of them could keep a hundred writes waiting at the API
#: server, each request of the other controllers (the pods' ReplicaSets, the scheduler) and of
#: kubectl behind them: ``kubectl apply`` of fifty applications timed out at a minute.
WRITES_IN_FLIGHT = 24

#: how often a worker looks whether the leader's renewal came, while its writes are fenced
_FENCED_POLL_S = 0.1

#: The shortest time between two of the worker's passes over one instance. Every status change
#: of its applications wakes it (its status summarises theirs), and with a thousand rolling out
#: back-to-back passes would rewrite that status, a thousand entries, without a pause.
INSTANCE_PASS_INTERVAL_S = 5.0

#: How often each custom resource is resynced (:meth:`Operator.resync`): the safety net against
#: a change no event announced.
RESYNC_S = 30.0

#: A resync of an application whose inputs did not change since its last pass skips the pass,
#: except every this many resyncs (the safety net against drift an event did not announce).
FULL_RESYNC_EVERY = 10


class Operator:
    def __init__(self, settings: OperatorSettings, elector: LeaderElector | None = None) -> None:
        self.settings = settings
        self._elector = elector
        #: the client of the admin API and the caches (never fenced); set by :meth:`start`
        self.kube: Kube | None = None
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._passes = asyncio.Semaphore(CONCURRENT_PASSES)
        #: keys of the custom resources to reconcile, in the order they became dirty; a key is
        #: queued once until a worker takes it (changes meanwhile are read by that pass)
        self._dirty: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        #: instance key -> when the worker last started a pass over it (monotonic)
        self._instance_passed: dict[str, float] = {}
        #: custom resource key -> when its status was last written (monotonic), and the timers
        #: of the passes writing a status held back (:mod:`kubeserve.control.status_pacing`)
        self._status_written: dict[str, float] = {}
        self._status_due: dict[str, asyncio.TimerHandle] = {}
        #: application key -> the digest of its inputs at its last pass, while RUNNING and settled
        self._settled: dict[str, str] = {}
        self._resync_turns = ResyncTurns(FULL_RESYNC_EVERY)
        self.cluster: Cluster | None = None
        self._reconcilers: dict[str, Reconciler] = {}
        self._data_plane: DataPlane | None = None
        self._autoscalers = Autoscalers(on_decided=self._wake_scaled)
        self._caller_reports = CallerReports()
        self._worker: asyncio.Task[None] | None = None
        self.reconciles = 0
        self.reconcile_errors = 0
        self.resyncs_skipped = 0
        #: passes whose write the fence refused (the Lease's renewal late, or the term over)
        self.fenced_passes = 0
        self._fenced_logged = False

    async def start(self) -> None:
        """Connect and fill the caches (the admin API reads them); reconciling starts with
        :meth:`lead`."""
        self.kube = kube = await Kube.connect(self.settings.kubeconfig)
        kube.limit_writes(WRITES_IN_FLIGHT)
        writer = kube if self._elector is None else kube.fenced(self._elector.may_write)
        namespaces = list(self.settings.watch_namespaces) or None
        cache = ClusterCache(kube, namespaces, self._changed, on_deleted=self._deleted)
        self.cluster = Cluster(writer, cache)
        data_plane = DataPlane(
            writer,
            on_pushed=self._pushed,
            report_url=self.settings.report_url,
            default_data_path=self.settings.proxy_data_path,
            node_sockets_auto=self.settings.node_sockets_auto,
        )
        self._data_plane = data_plane
        self._reconcilers = {
            "ServeInstance": InstanceReconciler(self.cluster, data_plane, self.settings.namespace),
            "ServeApplication": ApplicationReconciler(self.cluster, data_plane, self._autoscalers),
        }
        await self.cluster.cache.start()

    @property
    def leading(self) -> bool:
        return self._worker is not None

    def lead(self) -> None:
        """Start reconciling: every custom resource is dirty (a follower ignored all changes)."""
        if self._worker is None:
            self._fenced_logged = False
            self._worker = asyncio.ensure_future(self._work())
            self._wake_all()

    async def follow(self) -> None:
        """Stop reconciling (a pass in flight is cancelled; its writes are fenced already)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def close(self) -> None:
        await self.follow()
        if self.cluster is not None:
            await self.cluster.cache.close()
            await self.cluster.kube.close()

    async def reconcile(self, obj: dict[str, Any]) -> None:
        """One pass over a ServeInstance or ServeApplication (serialised per object, at most
        :data:`CONCURRENT_PASSES` at once): its reconciler converges the children and reports;
        the report becomes the status."""
        assert self.cluster is not None
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta['namespace']}/{meta['name']}"
        async with self._locks[key], self._passes:
            latest = self.cluster.cache.get(obj["kind"], meta["namespace"], meta["name"]) or obj
            if latest["metadata"].get("deletionTimestamp"):
                self._forget(key)
                return  # children go with it (ownerReferences); nothing to converge to
            self.reconciles += 1
            digest = self._digest(obj["kind"], latest)
            try:
                report = await self._reconcilers[obj["kind"]].reconcile(latest)
                status = report.patch(latest)
                if isinstance(report, ApplicationReport) and report.provisional:
                    self._settled.pop(key, None)  # the replica's answer wakes the next pass
                    return
                paced = await self._write_status(key, latest, status)
            except Exception:
                self.reconcile_errors += 1
                self._settled.pop(key, None)
                raise
            if paced or status.get("appStatus") != "RUNNING":  # a pass is due anyway
                self._settled.pop(key, None)
            elif digest is not None:
                self._settled[key] = digest

    async def _write_status(self, key: str, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """Write the pass's ``status`` of ``obj`` now, or, when it only moves the progress of a
        status written less than :data:`~kubeserve.control.status_pacing.PROGRESS_INTERVAL_S`
        ago, have a pass write it then (see :mod:`kubeserve.control.status_pacing`): whether it
        was held back."""
        assert self.cluster is not None
        now = time.monotonic()
        old = self.cluster.current_status(obj)
        delay = status_pacing.write_delay(old, status, self._status_written.get(key), now)
        if delay > 0:
            if key not in self._status_due:
                self._status_due[key] = asyncio.get_running_loop().call_later(
                    delay, self._status_came_due, key
                )
            return True
        if await self.cluster.patch_status(obj, status):
            self._status_written[key] = now
        return False

    def _status_came_due(self, key: str) -> None:
        self._status_due.pop(key, None)
        if self.leading:
            self._mark(key)

    async def reconcile_or_requeue(self, obj: dict[str, Any]) -> None:
        """:meth:`reconcile` for kopf's handlers: a pass that failed for the API (a timeout, a
        conflict, a write fenced while the Lease's renewal is late) goes back to the worker's
        queue, which tries it again as soon as a pass is free (kopf would wait a minute)."""
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta['namespace']}/{meta['name']}"
        try:
            await self.reconcile(obj)
        except KubeFenced:
            self._fenced(key)
        except KubeError as exc:
            log.warning("reconcile of %s failed: %s (will retry)", key, exc)
            self._mark(key)

    def _fenced(self, key: str) -> None:
        """A pass whose write the fence refused: expected while the Lease's renewal is late
        (the pass goes back to the queue, taken again once the fence opens) and when a term
        ends; logged once per term."""
        self.fenced_passes += 1
        if not self._fenced_logged:
            self._fenced_logged = True
            log.warning("reconcile of %s held back: this replica may not write now", key)
        self._mark(key)

    def resync(self, kind: str, obj: dict[str, Any]) -> None:
        """The periodic pass (the worker's, soon): skipped for a RUNNING application whose
        inputs are those of its last pass (a pass that changed anything changed a
        resourceVersion among them), except once in :data:`FULL_RESYNC_EVERY` resyncs (when,
        differs between applications). An application not RUNNING may wait on what no input
        shows (a replica that did not answer yet): its resync always runs."""
        key = key_of(kind, obj)
        full = self._resync_turns.full(key)
        settled = self._settled.get(key)
        if settled is not None and not full and self._digest(kind, obj) == settled:
            self.resyncs_skipped += 1
            return
        self._mark(key)

    async def _resync_all(self) -> None:
        """Every custom resource's :meth:`resync` once every :data:`RESYNC_S`, spread over the
        interval. (kopf's timers did it first: a timer holds a finalizer on its object, one write
        when it is created and one more before it may go, and a task per object.)"""
        assert self.cluster is not None
        while True:
            keys = [(k, key_of(k, o)) for k in CUSTOM_KINDS for o in self.cluster.cache.all(k)]
            if not keys:
                await asyncio.sleep(RESYNC_S)
            for kind, key in keys:
                await asyncio.sleep(RESYNC_S / len(keys))
                obj = self.cluster.cache.get(kind, *key.split("/", 2)[1:])
                if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                    self.resync(kind, obj)

    def _digest(self, kind: str, obj: dict[str, Any]) -> str | None:
        """The digest of an application's inputs (None for an instance: one per namespace,
        never skipped)."""
        if kind != "ServeApplication" or self.cluster is None:
            return None
        user_configs = {} if self._data_plane is None else self._data_plane.user_configs
        build = self.cluster.builds.get(key_of(kind, obj))
        return inputs_digest(self.cluster.cache, obj, user_configs, build)

    # -- load reports of the pods (a LoadReportSink of the admin server) -------------------------

    @property
    def scales_to_zero(self) -> bool:
        """Whether pods can report what waits for a replica, so deployments may scale to zero."""
        return self.settings.report_url is not None

    def reports_go_to(self) -> str | None:
        """None while this process reconciles; else the leader's admin URL ("" unknown)."""
        if self.leading or self._elector is None:
            return None
        return self._elector.leader_url

    def instance_secret(self, namespace: str, instance: str) -> bytes | None:
        """The data-plane secret of a ServeInstance the operator has reconciled, else None."""
        obj = (
            None
            if self.cluster is None
            else self.cluster.cache.get("ServeInstance", namespace, instance)
        )
        if obj is None or self._data_plane is None:
            return None
        return self._data_plane.known_secret(obj["metadata"]["uid"])

    def record_queued(
        self, namespace: str, instance: str, caller_id: str, queued: dict[str, int]
    ) -> None:
        """A pod's report of requests waiting per deployment key (signature already checked)."""
        assert self.cluster is not None
        caller = f"{namespace}/{instance}/{caller_id}"
        for key, count in self._caller_reports.update(caller, queued).items():
            app, deployment = wire.split_deployment_key(key)
            for obj in self.cluster.cache.objects("ServeApplication", namespace):
                if contract.application_name(obj) == app and contract.instance_of(obj) == instance:
                    scaler = scaling_key(namespace, obj["metadata"]["name"], deployment)
                    self._autoscalers.record_queued(scaler, caller, count)

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        assert self.cluster is not None
        assert self.kube is not None
        return metrics_text(
            self.reconciles,
            self.reconcile_errors,
            self.kube.counts,
            self.leading,
            self.cluster.cache.all("ServeApplication"),
            self.resyncs_skipped,
            self._elector.terms if self._elector is not None else 0,
            self._elector.fence_shuts if self._elector is not None else 0,
        )

    def _changed(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if self.cluster is not None:
            for key in concerned(self.cluster.cache, kind, obj, old):
                self._mark(key)

    def _deleted(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "Pod":
            if self._data_plane is not None:
                self._data_plane.forget_pod(obj)
        elif kind in CUSTOM_KINDS:
            self._forget(key_of(kind, obj))

    def _forget(self, key: str) -> None:
        """Drop what the operator remembers of a custom resource that is going."""
        self._settled.pop(key, None)
        if self.cluster is not None:
            self.cluster.builds.pop(key, None)
        self._resync_turns.forget(key)
        self._status_written.pop(key, None)
        due = self._status_due.pop(key, None)
        if due is not None:
            due.cancel()

    def _pushed(self, pod: dict[str, Any]) -> None:
        """A user_config push to ``pod`` ended: its application's pass reads the outcome."""
        self._changed("Pod", pod, None)

    def _wake_all(self) -> None:
        """Mark every custom resource dirty (when leading starts)."""
        if self.cluster is None:
            return
        for kind in CUSTOM_KINDS:
            for obj in self.cluster.cache.all(kind):
                self._mark(key_of(kind, obj))

    def _wake_scaled(self, scaler_keys: Iterable[str]) -> None:
        """Mark dirty the applications of these autoscalers (one decided, or its next read is
        due): their passes render the new targets, or read the load again."""
        if self.leading:
            for scaler in scaler_keys:
                namespace, application, _ = scaler.split("/", 2)
                self._mark(f"ServeApplication/{namespace}/{application}")

    def _mark(self, key: str) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._dirty.put_nowait(key)

    async def _work(self) -> None:
        """:data:`CONCURRENT_PASSES` workers taking dirty keys in turn, and the resync."""
        workers = [asyncio.ensure_future(self._worker_loop()) for _ in range(CONCURRENT_PASSES)]
        workers.append(asyncio.ensure_future(self._resync_all()))
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _writable(self) -> None:
        """Until this process may write (at once without election): while the renewal of the
        Lease is late every write would be fenced, and the pass would only fail."""
        while self._elector is not None and not self._elector.may_write():  # noqa: ASYNC110
            await asyncio.sleep(_FENCED_POLL_S)  # (the fence is a clock, not an event)

    async def _worker_loop(self) -> None:
        assert self.cluster is not None
        while True:
            key = await self._dirty.get()
            await self._writable()
            self._queued.discard(key)
            kind, namespace, name = key.split("/", 2)
            obj = self.cluster.cache.get(kind, namespace, name)
            if obj is None:
                continue
            if kind == "ServeInstance":
                due = self._instance_passed.get(key, 0.0) + INSTANCE_PASS_INTERVAL_S
                wait = due - time.monotonic()
                if wait > 0:
                    if key not in self._queued:
                        self._queued.add(key)
                        asyncio.get_running_loop().call_later(wait, self._dirty.put_nowait, key)
                    continue
                self._instance_passed[key] = time.monotonic()
            try:
                await self.reconcile(obj)
            except KubeFenced:
                self._fenced(key)
            except KubeError as exc:
                log.warning("reconcile of %s failed: %s (will retry)", key, exc)
                self._mark(key)
            except Exception:
                log.exception("reconcile of %s failed", key)
