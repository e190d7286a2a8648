"""One serve deployment on the local machine: its target, rollout and failure accounting.

Ownership: a :class:`DeploymentState` owns its :class:`ReplicaProcess` objects, and each replica
owns its lifecycle (start, ready, health, reconfigure, stop: see :mod:`replica_process`),
reporting every change of state to :meth:`DeploymentState._on_transition`, which counts failures,
holds starts back after them and wakes the controller. :meth:`DeploymentState.reconcile` is the
level-triggered step: it compares replicas to the target (count, version, user_config) and
starts, stops or reconfigures; calling it again with nothing changed does nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Coroutine
from typing import Any

from kubeserve.backends.local import processes
from kubeserve.backends.local.adoption import AdoptedReplica
from kubeserve.backends.local.autoscaling import DeploymentScaling
from kubeserve.backends.local.capacity import process_gpus
from kubeserve.backends.local.process_records import ReplicaRecord
from kubeserve.backends.local.replica_context import ReplicaContext
from kubeserve.backends.local.replica_process import ReplicaProcess, ReplicaSpec
from kubeserve.control import backoff, placement, rollout
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.status_derivation import DeploymentView, ReplicaStateValue, ReplicaView
from kubeserve.control.user_config import needs_push
from kubeserve.runtime import wire
from kubeserve.runtime.runtime_env import PreparedEnv

log = logging.getLogger(__name__)

#: How long proxies and handles are given to learn of an endpoint change before the controller
#: relies on it (stopping the replicas it replaces): discovery is a long-poll answered at once,
#: well under this on one machine.
DISCOVERY_SETTLE_S = 2.0
#: Stopped replicas a deployment remembers for the details (Ray's default
#: ``RAY_SERVE_RETAINED_DEAD_REPLICAS``)
RETAINED_DEAD_REPLICAS = 10
#: How :meth:`DeploymentState.reconcile` replaces replicas of an older version when the config
#: sets neither ``rolling_update_percentage`` nor ``max_surge_percent``: every missing replica of
#: the new version starts at once, beside the old ones, which stop as new ones serve in their place.
ROLLOUT = rollout.SIDE_BY_SIDE
_counter = itertools.count(1)


class DeploymentState:
    def __init__(self, app: str, name: str, context: ReplicaContext, app_uid: str = "") -> None:
        """``app_uid``: the application's incarnation (see :class:`ReplicaRecord`)."""
        self.app = app
        self.app_uid = app_uid
        self.name = name
        #: what replicas of the current version start with (from :meth:`set_target` on)
        self.spec: ReplicaSpec | None = None
        self._ctx = context
        #: Ray's defaults until :meth:`set_target` (see :attr:`has_target`)
        self.config = EffectiveDeployment(name)
        self.version = ""
        self.user_config_version = ""
        self.replicas: dict[str, ReplicaProcess] = {}
        #: replicas that stopped lately, newest last, for their logs (Ray keeps ten)
        self.dead_replicas: deque[ReplicaProcess] = deque(maxlen=RETAINED_DEAD_REPLICAS)
        self.startup_failures = 0
        self.ever_healthy = False
        self.last_error = ""
        self.health_error = ""
        #: why some replicas wait for resources ("" when none do)
        self.unschedulable = ""
        #: consecutive failures of any kind (see :mod:`kubeserve.control.backoff`)
        self.failure_streak = 0
        self._backoff_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        #: a deployment the application's graph no longer has, whose replicas are being stopped
        #: (its target is 0 until a graph wants it again)
        self.retired = False
        #: how many replicas it wants (autoscaled, set externally, or fixed)
        self.scaling = DeploymentScaling(self._label, self.running_replicas, context.wake)
        self.scaling.set_config(self.config)

    # -- desired state ---------------------------------------------------------------------------
    @property
    def _label(self) -> str:
        """How log records name this deployment: ``app/deployment``."""
        return f"{self.app or 'default'}/{self.name}"

    @property
    def has_target(self) -> bool:
        """Whether :meth:`set_target` gave the deployment its config (and version) yet."""
        return bool(self.version)

    def set_target(
        self,
        config: EffectiveDeployment,
        version: str,
        env: PreparedEnv,
        import_path: str,
        app_args: dict[str, Any] | None = None,
        route_prefix: str | None = None,
        *,
        app_graph: str | None = None,
        http_root_path: str = "",
        tracing_config: dict[str, Any] | None = None,
    ) -> None:
        """``version`` covers ``import_path`` (or ``app_graph``, an imperative application's
        pickled graph, base64), ``app_args`` and ``env``: replicas of another version are
        replaced (new ones start with these before old ones stop)."""
        self.spec = ReplicaSpec(
            app=self.app,
            app_uid=self.app_uid,
            deployment=self.name,
            import_path=import_path,
            app_args=dict(app_args or {}),
            route_prefix=route_prefix,
            http_root_path=http_root_path,
            tracing_config=tracing_config,
            env=env,
            app_graph=app_graph,
        )
        if version != self.version:
            self.startup_failures, self.ever_healthy, self._backoff_until = 0, False, 0.0
            self.failure_streak = 0
            self.last_error = self.health_error = ""
        self.config, self.version = config, version
        self.retired = False  # wanted again (a graph that has it once more)
        for replica in self.replicas.values():
            replica.config = config
        self.user_config_version = config.user_config_version
        self.scaling.set_config(config)

    @property
    def target(self) -> int:
        return 0 if self.retired else self.scaling.target

    # -- serving ---------------------------------------------------------------------------------
    def running_replicas(self) -> list[ReplicaProcess]:
        return [r for r in self.replicas.values() if r.serving]

    # -- observation -----------------------------------------------------------------------------
    def view(self) -> DeploymentView:
        autoscaler = self.scaling.autoscaler
        return DeploymentView(
            target_replicas=self.target,
            replicas=[
                ReplicaView(
                    state=r.state,
                    current=r.version == self.version,
                    healthy=r.healthy,
                    config_applied=r.applied_user_config == self.user_config_version,
                )
                for r in self.replicas.values()
            ],
            startup_failures=self.startup_failures,
            ever_healthy=self.ever_healthy,
            last_error=self.last_error,
            health_error=self.health_error,
            unschedulable=self.unschedulable,
            failure_streak=self.failure_streak,
            autoscaling_error=autoscaler.policy_error if autoscaler is not None else "",
        )

    def endpoints(self, unavailable: str | None = None) -> wire.DeploymentEndpoints:
        """What the data plane routes to: the ready replicas, the limits, and ``unavailable``
        (:func:`~kubeserve.runtime.wire.no_replica_coming`) when no replica is coming."""
        ready = [
            wire.ReplicaEndpoint(replica_id=r.replica_id, host="127.0.0.1", port=r.port)
            for r in self.replicas.values()
            if r.serving
        ]
        # mypy wants each optional key of the TypedDict in some ** item; "unavailable" is set below
        endpoints: wire.DeploymentEndpoints = {
            "max_ongoing_requests": self.config.max_ongoing_requests,
            "replicas": ready,
            **wire.queue_limits(self.config),  # type: ignore[typeddict-item]
        }
        if unavailable is not None:
            endpoints["unavailable"] = unavailable
        if (router := wire.request_router_spec(self.config)) is not None:
            endpoints["request_router"] = router
        return endpoints

    # -- reconciliation --------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One level-triggered step towards the target; idempotent."""
        self._forget_failures_once_stable()
        live = [r for r in self.replicas.values() if r.state in ("STARTING", "RUNNING")]
        current = [r for r in live if r.version == self.version]
        old = [r for r in live if r.version != self.version]
        # Surplus replicas, replaced ones as the rollout allows, and the new ones it has room for
        policy = self.config.rollout(ROLLOUT)
        step = rollout.rollout_step(_rollout(current), _rollout(old), self.target, policy)
        for replica_id in step.stop:
            self._stop(self.replicas[replica_id])
        if step.start > 0 and time.monotonic() >= self._backoff_until:
            self._start_what_fits(step.start, [r for r in old if r.state != "STOPPING"])
        elif self.target <= len(current):
            self.unschedulable = ""
        serving_current = step.serving
        if step.settled < serving_current and old:
            asyncio.get_running_loop().call_later(DISCOVERY_SETTLE_S, self._ctx.wake)
        route = self._route_prefix()
        for replica in current:
            if (
                replica.state == "RUNNING"
                and (
                    needs_push(replica.applied_user_config or None, self.user_config_version)
                    or replica.applied_route_prefix not in (None, route)
                )
                and not replica.reconfiguring
            ):
                self._spawn(self._reconfigure(replica))
        if self.health_error and serving_current >= self.target:
            self.health_error = ""
        if serving_current == self.target and not old and self.target > 0:
            self.ever_healthy = True

    def stop_all(self) -> None:
        for replica in list(self.replicas.values()):
            self._stop(replica)

    def _start_what_fits(self, missing: int, old: list[ReplicaProcess]) -> None:
        """Start the missing replicas :func:`placement.place` lets start now, say why the
        others wait, and stop an old replica when that makes room for the new version."""
        capacity = self._ctx.capacity
        node = placement.Node(
            free=capacity.free(),
            total=capacity.total,
            gpu_free=capacity.gpu_free,
            labels=capacity.labels,
            start_slots=capacity.free_start_slots(),
            low_memory=capacity.memory_low(),
        )
        old_serving = bool(old) and not any(r.state == "STOPPING" for r in self.replicas.values())
        decision = placement.place(
            self.app, self.name, self.config, missing, node, len(self.replicas), old_serving
        )
        claim = placement.replica_claim(self.config)
        for _ in range(decision.start):
            self._start(claim)
        self.unschedulable = decision.reason
        if decision.make_room:
            # A rolling update on a full instance: free one old replica's resources for a new one.
            self._stop(self.replicas[rollout.stop_order(_rollout(old))[0].replica_id])

    # -- replica lifecycle ---------------------------------------------------------------------
    def _new_replica(self, replica_id: str, version: str, port: int) -> ReplicaProcess:
        return ReplicaProcess(
            replica_id=replica_id,
            version=version,
            port=port,
            log_path=self._ctx.log_dir / f"replica_{self.app or 'default'}_{replica_id}.log",
            config=self.config,
            context=self._ctx,
            on_transition=self._on_transition,
            label=self._label,
        )

    def _start(self, claim: dict[str, float]) -> None:
        """Start one replica holding ``claim`` (which :func:`placement.place` found room for)."""
        assert self.spec is not None
        gpus = self._ctx.capacity.assign_gpus(claim.get("GPU", 0.0))
        assert gpus is not None, "placement.place counted the devices"
        replica_id = f"{self.name}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        replica = self._new_replica(replica_id, self.version, processes.free_port())
        replica.claim, replica.holds_start_slot, replica.gpus = claim, True, gpus
        self._ctx.capacity.take(claim)
        self._ctx.capacity.hold_gpus(gpus, claim.get("GPU", 0.0))
        self.replicas[replica_id] = replica
        replica.start(self.spec)

    def adopt_all(self, replicas: list[AdoptedReplica]) -> None:
        """Adopt ``replicas`` (see :meth:`adopt`); an autoscaling deployment starts from their
        count (within its bounds), not from its initial target."""
        for replica in replicas:
            self.adopt(replica.record, replica.proc)
        if replicas:
            self.scaling.adopt(sum(1 for r in replicas if r.record.version == self.version))

    def adopt(self, record: ReplicaRecord, proc: processes.AdoptedProcess) -> None:
        """Take over a replica an earlier ``kubeserve start`` left serving (its identity was
        checked over the channel): it joins as RUNNING with the version and user_config it
        has, and :meth:`reconcile` treats it like any other (reconfigures, replaces or stops it
        when it is not what the config wants). Proxies and handles already know it: it counts
        as settled at once."""
        replica = self._new_replica(record.replica_id, record.version, record.port)
        replica.state = "RUNNING"
        replica.applied_user_config = record.user_config_version
        replica.ready_at = time.monotonic() - DISCOVERY_SETTLE_S
        replica.claim = placement.replica_claim(self.config)
        self._ctx.capacity.take(replica.claim)
        need = replica.claim.get("GPU", 0.0)
        held = process_gpus(proc.pid) if need else []
        replica.gpus = held if held is not None else (self._ctx.capacity.assign_gpus(need) or [])
        self._ctx.capacity.hold_gpus(replica.gpus, need)
        self.replicas[replica.replica_id] = replica
        log.info("%s: adopted replica %s (pid %d)", self._label, replica.replica_id, proc.pid)
        replica.watch(proc)

    def _stop(self, replica: ReplicaProcess) -> None:
        replica.stop("not wanted")

    def _on_transition(
        self, replica: ReplicaProcess, old: ReplicaStateValue, new: ReplicaStateValue, reason: str
    ) -> None:
        """What a replica's change of state means here (see :mod:`replica_process`)."""
        if new == "RUNNING" and old == "STARTING":
            self.startup_failures = 0
        elif new == "RUNNING" and not replica.healthy:
            self.health_error = self.last_error = reason
            replica.stop("failed its health check")
        elif new == "STOPPED":
            self._ctx.capacity.release(replica.claim)
            self._ctx.capacity.free_gpus(replica.gpus, replica.claim.get("GPU", 0.0))
            if self.replicas.pop(replica.replica_id, None) is not None:
                self.dead_replicas.append(replica)
            if reason and old == "STARTING":
                self.startup_failures += 1
            if reason and old != "STOPPING":
                self._record_failure(reason)
        self._ctx.wake()

    def _record_failure(self, message: str) -> None:
        """Remember the error and hold further starts back (:func:`backoff.restart_delay`)."""
        self.failure_streak += 1
        self.last_error = message
        delay = backoff.restart_delay(self.failure_streak)
        log.warning("%s: %s (next start in %.1f s)", self._label, message, delay)
        self._backoff_until = time.monotonic() + delay
        self._ctx.wake()
        asyncio.get_running_loop().call_later(delay, self._ctx.wake)

    def _forget_failures_once_stable(self) -> None:
        now = time.monotonic()
        if self.failure_streak and any(
            r.serving and now - r.ready_at >= backoff.STABLE_AFTER_S for r in self.replicas.values()
        ):
            self.failure_streak = 0

    def _route_prefix(self) -> str:
        """The application's route prefix as replicas report it ("" for none)."""
        return str(self.spec.route_prefix or "") if self.spec is not None else ""

    async def _reconfigure(self, replica: ReplicaProcess) -> None:
        error = await replica.reconfigure(
            self.config.user_config, self.user_config_version, self._route_prefix()
        )
        if error:
            self.last_error = error
        if not replica.healthy:
            replica.stop("reconfigure failed")
        self._ctx.wake()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _rollout(replicas: list[ReplicaProcess]) -> list[rollout.RolloutReplica]:
    now = time.monotonic()
    return [
        rollout.RolloutReplica(
            replica_id=r.replica_id,
            running=r.serving,
            settled=now - r.ready_at >= DISCOVERY_SETTLE_S,
            start_time_s=r.start_time_s,
        )
        for r in replicas
    ]
