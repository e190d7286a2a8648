"""One serve deployment on the local machine: its replica processes and their lifecycle.

Ownership: a :class:`DeploymentState` owns its :class:`ReplicaProcess` objects; each replica has one
lifecycle task that starts the process, waits until it answers ``/-/healthz``, health-checks it
every ``health_check_period_s`` and removes it when the process exits.
:meth:`DeploymentState.reconcile` is the level-triggered step: it compares replicas to the target
(count, version, user_config) and starts, stops or reconfigures; calling it again with nothing
changed does nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeserve.backends.local import processes
from kubeserve.backends.local.adoption import AdoptedReplica
from kubeserve.backends.local.process_records import ReplicaRecord
from kubeserve.backends.local.replica_context import ReplicaContext
from kubeserve.control import backoff, effective_config, placement
from kubeserve.control.autoscaling import Direction
from kubeserve.control.autoscaling_state import DeploymentAutoscaler, ReplicaLoad
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.status_derivation import DeploymentView, ReplicaStateValue, ReplicaView
from kubeserve.control.user_config import needs_push
from kubeserve.runtime import channel, metrics, wire
from kubeserve.runtime.runtime_env import PreparedEnv

log = logging.getLogger(__name__)

#: How long one readiness probe of a starting replica may take.
_READY_TIMEOUT_S = 5.0
#: How long a replica's ``reconfigure`` may take before it counts as failed.
_RECONFIGURE_TIMEOUT_S = 300.0
#: How often a starting replica's ``/-/healthz`` is polled: short, because it bounds deploy latency.
_READY_POLL_S = 0.02
#: How long proxies and handles are given to learn of an endpoint change before the controller
#: relies on it (stopping the replicas it replaces): discovery is a long-poll answered at once,
#: well under this on one machine.
DISCOVERY_SETTLE_S = 2.0
_counter = itertools.count(1)


@dataclass
class ReplicaProcess:
    replica_id: str
    version: str
    port: int
    log_path: Path
    state: ReplicaStateValue = "STARTING"
    healthy: bool = True
    #: the user_config version the replica last reported applying ("" until its first answer)
    applied_user_config: str = ""
    reconfiguring: bool = False
    pid: int | None = None
    start_time_s: float = field(default_factory=time.time)
    #: ``time.monotonic()`` when it became RUNNING (0 before)
    ready_at: float = 0.0
    #: what it holds of the instance's resources (see :class:`Capacity`)
    claim: dict[str, float] = field(default_factory=dict)
    #: holds one of the instance's start slots (until it is ready or gone)
    holds_start_slot: bool = False
    proc: processes.Child | None = None


class DeploymentState:
    def __init__(self, app: str, name: str, context: ReplicaContext, app_uid: str = "") -> None:
        """``app_uid``: the application's incarnation (see :class:`ReplicaRecord`)."""
        self.app = app
        self.app_uid = app_uid
        self.name = name
        self.import_path = ""
        self.app_args: dict[str, Any] = {}
        self.route_prefix: str | None = None
        self._ctx = context
        #: Ray's defaults until :meth:`set_target` (see :attr:`has_target`)
        self.config = EffectiveDeployment(name)
        self.version = ""
        self.user_config_version = ""
        self.env: PreparedEnv | None = None
        self.replicas: dict[str, ReplicaProcess] = {}
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
        #: the instance's ``target_capacity`` and its direction (see :mod:`control.autoscaling`)
        self.target_capacity: float | None = None
        self.capacity_direction: Direction | None = None
        #: owns the target of an autoscaling deployment (``None`` for a fixed count)
        self.autoscaler: DeploymentAutoscaler | None = None
        #: the count set through the external scaling API (``external_scaler_enabled``)
        self.external_target: int | None = None
        self._reading_metrics = False

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
    ) -> None:
        """``version`` covers ``import_path``, ``app_args`` and ``env``: replicas of another
        version are replaced (new ones start with these before old ones stop)."""
        self.import_path = import_path
        self.app_args = dict(app_args or {})
        self.route_prefix = route_prefix
        if version != self.version:
            self.startup_failures, self.ever_healthy, self._backoff_until = 0, False, 0.0
            self.failure_streak = 0
            self.last_error = self.health_error = ""
        self.config, self.version, self.env = config, version, env
        self.user_config_version = config.user_config_version
        self._configure_autoscaler()

    def set_capacity(self, target_capacity: float | None, direction: Direction | None) -> None:
        self.target_capacity, self.capacity_direction = target_capacity, direction
        self._configure_autoscaler()

    def _configure_autoscaler(self) -> None:
        raw = self.config.autoscaling_config
        now = time.time()
        if not raw:
            self.autoscaler = None
        elif self.autoscaler is None:
            self.autoscaler = DeploymentAutoscaler(
                raw, now, self.target_capacity, self.capacity_direction
            )
        else:
            self.autoscaler.reconfigure(raw, now, self.target_capacity, self.capacity_direction)

    @property
    def target(self) -> int:
        if self.autoscaler is not None:
            return self.autoscaler.target
        if self.external_target is not None:
            return self.external_target
        return self.config.target_replicas(self.target_capacity)

    # -- autoscaling -----------------------------------------------------------------------------
    def running_replicas(self) -> list[ReplicaProcess]:
        return [r for r in self.replicas.values() if r.state == "RUNNING" and r.healthy]

    def autoscale_due(self, now: float) -> bool:
        """Whether it is time to read the replicas' load and decide again."""
        scaler = self.autoscaler
        return scaler is not None and not self._reading_metrics and now >= scaler.next_read_at

    async def autoscale(self) -> None:
        """Read every running replica's load, decide, and wake the controller on a change."""
        scaler = self.autoscaler
        if scaler is None:
            return
        self._reading_metrics = True
        scaler.next_read_at = time.time() + scaler.config.metrics_interval_s
        try:
            running = self.running_replicas()
            loads = await asyncio.gather(*(self._read_load(r) for r in running))
            now = time.time()
            for replica, load in zip(running, loads, strict=True):
                if load is not None:
                    scaler.record_replica(replica.replica_id, load, now)
            scaler.forget_replicas(r.replica_id for r in running)
            self._decide(now)
        finally:
            self._reading_metrics = False

    def record_queued(self, caller_id: str, queued: int) -> None:
        """A caller's report of requests waiting for this deployment (see
        :mod:`kubeserve.runtime.load_report`); a request waiting on zero replicas decides now."""
        scaler = self.autoscaler
        if scaler is None:
            return
        now = time.time()
        scaler.record_queued(caller_id, queued, now)
        if queued and not self.running_replicas():
            self._decide(now)

    def _decide(self, now: float) -> None:
        assert self.autoscaler is not None
        before = self.autoscaler.target
        if self.autoscaler.step(len(self.running_replicas()), now):
            log.info("%s: %s", self._label, self.autoscaler.decisions[-1].reason)
            if self.autoscaler.target != before:
                self._ctx.wake()

    async def _read_load(self, replica: ReplicaProcess) -> ReplicaLoad | None:
        try:
            status, body = await self._internal(replica, "GET", wire.METRICS_PATH, b"", 5.0)
        except (OSError, TimeoutError):
            return None
        if status != 200:
            return None
        return ReplicaLoad.from_metrics(wire.parse_metrics(body.decode("utf-8", "replace")))

    # -- observation -----------------------------------------------------------------------------
    def view(self) -> DeploymentView:
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
        )

    def endpoints(self) -> wire.DeploymentEndpoints:
        ready = [
            wire.ReplicaEndpoint(replica_id=r.replica_id, host="127.0.0.1", port=r.port)
            for r in self.replicas.values()
            if r.state == "RUNNING" and r.healthy
        ]
        return {
            "max_ongoing_requests": self.config.max_ongoing_requests,
            "replicas": ready,
            **wire.queue_limits(self.config),
        }

    # -- reconciliation --------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One level-triggered step towards the target; idempotent."""
        self._forget_failures_once_stable()
        for replica in list(self.replicas.values()):
            if replica.state == "RUNNING" and not replica.healthy:
                self._stop(replica)
        live = [r for r in self.replicas.values() if r.state in ("STARTING", "RUNNING")]
        current = [r for r in live if r.version == self.version]
        old = [r for r in live if r.version != self.version]
        missing = self.target - len(current)
        if missing > 0 and time.monotonic() >= self._backoff_until:
            self._start_what_fits(missing, old)
        elif missing <= 0:
            self.unschedulable = ""
        if missing < 0:
            for replica in _stop_order(current)[:-missing]:
                self._stop(replica)
        serving_current = sum(1 for r in current if r.state == "RUNNING" and r.healthy)
        # Rolling replacement: an old replica goes only once a new one serves in its place, and
        # proxies and handles have had DISCOVERY_SETTLE_S to learn of the new one (otherwise the
        # old one could be the only replica they know of when it stops taking requests).
        settled = sum(1 for r in current if r.state == "RUNNING" and r.healthy and _settled(r))
        for replica in _stop_order(old)[: len(old) - max(0, self.target - settled)]:
            self._stop(replica)
        if settled < serving_current and old:
            asyncio.get_running_loop().call_later(DISCOVERY_SETTLE_S, self._ctx.wake)
        for replica in current:
            if (
                replica.state == "RUNNING"
                and needs_push(replica.applied_user_config or None, self.user_config_version)
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
        """Start as many missing replicas as resources and start slots allow (see
        :func:`placement.admit`); say why the others wait."""
        capacity = self._ctx.capacity
        claim = placement.replica_claim(self.config)
        low = capacity.memory_low()
        if low is not None:
            self.unschedulable = placement.low_memory_message(self.app, self.name, missing, *low)
            return
        start, unschedulable = placement.admit(
            missing, claim, capacity.free(), capacity.free_start_slots()
        )
        for _ in range(start):
            self._start(claim)
        if not unschedulable:
            self.unschedulable = ""
            return
        self.unschedulable = placement.unschedulable_message(
            self.app, self.name, unschedulable, claim, capacity.free(), capacity.total
        )
        if start == 0 and old and not any(r.state == "STOPPING" for r in self.replicas.values()):
            # A rolling update on a full instance: free one old replica's resources for a new one.
            self._stop(_stop_order(old)[0])

    # -- replica lifecycle ---------------------------------------------------------------------
    def _start(self, claim: dict[str, float]) -> None:
        replica_id = f"{self.name}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        replica = ReplicaProcess(
            replica_id=replica_id,
            version=self.version,
            port=processes.free_port(),
            log_path=self._log_path(replica_id),
            claim=claim,
            holds_start_slot=True,
        )
        self._ctx.capacity.take(claim)
        self.replicas[replica_id] = replica
        self._spawn(self._lifecycle(replica, None))

    def adopt_all(self, replicas: list[AdoptedReplica]) -> None:
        """Adopt ``replicas`` (see :meth:`adopt`); an autoscaling deployment starts from their
        count (within its bounds), not from its initial target."""
        for replica in replicas:
            self.adopt(replica.record, replica.proc)
        if replicas and self.autoscaler is not None:
            self.autoscaler.adopt(sum(1 for r in replicas if r.record.version == self.version))

    def adopt(self, record: ReplicaRecord, proc: processes.AdoptedProcess) -> None:
        """Take over a replica an earlier ``kubeserve start`` left serving (its identity was
        checked over the channel): it joins as RUNNING with the version and user_config it
        has, and :meth:`reconcile` treats it like any other (reconfigures, replaces or stops it
        when it is not what the config wants). Proxies and handles already know it: it counts
        as settled at once."""
        replica = ReplicaProcess(
            replica_id=record.replica_id,
            version=record.version,
            port=record.port,
            log_path=self._log_path(record.replica_id),
            state="RUNNING",
            applied_user_config=record.user_config_version,
            pid=proc.pid,
            ready_at=time.monotonic() - DISCOVERY_SETTLE_S,
            claim=placement.replica_claim(self.config),
            proc=proc,
        )
        self._ctx.capacity.take(replica.claim)
        self.replicas[replica.replica_id] = replica
        log.info("%s: adopted replica %s (pid %d)", self._label, replica.replica_id, proc.pid)
        self._spawn(self._lifecycle(replica, proc))

    def _log_path(self, replica_id: str) -> Path:
        return self._ctx.log_dir / f"replica_{self.app or 'default'}_{replica_id}.log"

    def _record(self, replica: ReplicaProcess) -> None:
        assert replica.pid is not None
        started = processes.start_time(replica.pid)
        if started is None:
            return  # gone already: its lifecycle sees the exit
        self._ctx.records.put_replica(
            ReplicaRecord(
                replica_id=replica.replica_id,
                app=self.app,
                app_uid=self.app_uid,
                deployment=self.name,
                version=replica.version,
                user_config_version=replica.applied_user_config,
                port=replica.port,
                pid=replica.pid,
                start_time=started,
            )
        )

    def _stop(self, replica: ReplicaProcess) -> None:
        if replica.state in ("STOPPING", "STOPPED"):
            return
        replica.state = "STOPPING"
        self._ctx.records.remove_replica(replica.replica_id)  # a draining replica is not adopted
        log.info("%s: stopping replica %s", self._label, replica.replica_id)
        self._ctx.wake()
        if replica.proc is not None:
            timeout = self.config.graceful_shutdown_timeout_s
            self._spawn(processes.terminate(replica.proc, timeout))

    async def _lifecycle(
        self, replica: ReplicaProcess, adopted: processes.AdoptedProcess | None
    ) -> None:
        try:
            if adopted is None:
                await self._run(replica)
            else:
                await self._watch(replica, adopted)
        finally:
            self._ctx.records.remove_replica(replica.replica_id)
            self._free_start_slot(replica)
            self._ctx.capacity.release(replica.claim)
            self.replicas.pop(replica.replica_id, None)
            self._ctx.wake()

    def _free_start_slot(self, replica: ReplicaProcess) -> None:
        if replica.holds_start_slot:
            replica.holds_start_slot = False
            self._ctx.capacity.started()
            self._ctx.wake()  # another replica may start now

    def _replica_config(self, replica: ReplicaProcess) -> int:
        """The replica's :class:`wire.ReplicaConfig`, with the *current* user_config, in an
        in-memory file: the descriptor the replica inherits (the caller closes its own copy).

        Not an environment variable: ``user_config`` has no size limit of its own, and the
        environment of ``execve`` fails with E2BIG past ~128 KiB per variable. Not a file on the
        disk either: a replica must start (after a crash, say) while the state disk is full, and
        the config (``user_config`` may hold credentials) is then never on the disk at all.
        """
        replica_config: wire.ReplicaConfig = {
            "app": self.app,
            "deployment": self.name,
            "import_path": self.import_path,
            "replica_id": replica.replica_id,
            "user_config": self.config.user_config,
            "max_ongoing_requests": self.config.max_ongoing_requests,
            "graceful_shutdown_wait_loop_s": self.config.graceful_shutdown_wait_loop_s,
            "graceful_shutdown_timeout_s": self.config.graceful_shutdown_timeout_s,
            "request_limits": self._ctx.request_limits.to_mapping(),
            "app_args": self.app_args,
            "route_prefix": self.route_prefix,
        }
        if self.config.logging_config:
            replica_config["logging_config"] = dict(self.config.logging_config)
        fd = os.memfd_create(f"kubeserve-replica-{replica.replica_id}", os.MFD_CLOEXEC)
        try:
            data = memoryview(json.dumps(replica_config).encode())
            while data:
                data = data[os.write(fd, data) :]
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd

    async def _run(self, replica: ReplicaProcess) -> None:
        assert self.env is not None
        try:
            config_fd = self._replica_config(replica)
        except OSError as exc:
            self._record_startup_failure(replica, f"could not write the replica's config: {exc}")
            return
        env = self._ctx.child_env(
            {
                **self.env.env_vars,
                wire.REPLICA_CONFIG_FD_ENV: str(config_fd),
                wire.CONTROLLER_URL_ENV: self._ctx.controller_url,
                **self._ctx.data_plane_env(),
                **self._ctx.log_env(replica.log_path),
            },
            self.env.python_path,
        )
        try:
            proc = await processes.spawn(
                "kubeserve.runtime.replica",
                ["--host", "127.0.0.1", "--port", str(replica.port)],
                env=env,
                log_path=replica.log_path,
                cwd=self.env.cwd or self._ctx.base_dir,
                pass_fds=(config_fd,),
                die_with_parent=self._ctx.die_with_parent,
            )
        except OSError as exc:
            self._record_startup_failure(replica, f"could not start the replica process: {exc}")
            return
        finally:
            os.close(config_fd)
        replica.proc, replica.pid = proc, proc.pid
        self._record(replica)
        log.info(
            "%s: started replica %s (pid %d, log %s)",
            self._label,
            replica.replica_id,
            proc.pid,
            replica.log_path,
        )
        if _stopping(replica):  # stopped while spawning
            await processes.terminate(proc, 1.0)
            return
        await self._watch(replica, proc)

    async def _watch(self, replica: ReplicaProcess, proc: processes.Child) -> None:
        """Wait until the replica is ready (an adopted one is), health-check it until it exits,
        and say why it exited."""
        exited = asyncio.ensure_future(proc.wait())
        try:
            if replica.state == "RUNNING" or await self._wait_ready(replica, exited):
                await self._health_loop(replica, exited)
            code = await exited
        finally:
            if not exited.done():
                exited.cancel()
            processes.kill_group(proc.pid)  # what the replica started dies with it
            metrics.mark_process_dead(proc.pid, str(self._ctx.metrics_dir))
        if replica.state == "STOPPING":
            log.info("%s: replica %s stopped (exit code %s)", self._label, replica.replica_id, code)
            return
        if replica.state == "STARTING":
            tail = processes.log_tail(replica.log_path)
            self._record_startup_failure(
                replica, f"replica exited with code {code} before it was ready:\n{tail}"
            )
        else:
            tail = processes.log_tail(replica.log_path)
            self._record_failure(
                f"replica {replica.replica_id} exited unexpectedly with code {code}:\n{tail}"
            )

    def _record_startup_failure(self, replica: ReplicaProcess, message: str) -> None:
        self.startup_failures += 1
        self._record_failure(message)

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
            r.state == "RUNNING" and r.healthy and now - r.ready_at >= backoff.STABLE_AFTER_S
            for r in self.replicas.values()
        ):
            self.failure_streak = 0

    async def _wait_ready(self, replica: ReplicaProcess, exited: asyncio.Future[int]) -> bool:
        async def probe() -> bool:
            return not await self._check(replica, _READY_TIMEOUT_S)

        ready = await processes.wait_until_answering(
            probe, exited, lambda: replica.state == "STARTING", _READY_POLL_S
        )
        self._free_start_slot(replica)
        if ready:
            replica.state = "RUNNING"
            replica.ready_at = time.monotonic()
            log.info("%s: replica %s is ready", self._label, replica.replica_id)
            self.startup_failures = 0
            self._ctx.wake()
        return ready

    async def _health_loop(self, replica: ReplicaProcess, exited: asyncio.Future[int]) -> None:
        failures = 0
        while replica.state == "RUNNING":
            period = self.config.health_check_period_s
            await asyncio.wait([exited], timeout=period)
            if exited.done() or replica.state != "RUNNING":
                return
            timeout = self.config.health_check_timeout_s
            error = await self._check(replica, timeout)
            failures = failures + 1 if error else 0
            if error and failures < effective_config.HEALTH_CHECK_FAILURE_THRESHOLD:
                log.warning(
                    "%s: replica %s failed health check %d of %d in a row: %s",
                    self._label, replica.replica_id, failures,
                    effective_config.HEALTH_CHECK_FAILURE_THRESHOLD, error,
                )  # fmt: skip
            elif error:
                replica.healthy = False
                self.health_error = f"replica {replica.replica_id} failed its health check: {error}"
                log.warning("%s: %s", self._label, self.health_error)
                self.last_error = self.health_error
                self._ctx.wake()
                return

    async def _internal(
        self, replica: ReplicaProcess, method: str, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """One internal request to ``replica`` over the authenticated channel."""
        return await channel.request(
            "127.0.0.1",
            replica.port,
            method,
            path,
            self._ctx.secret,
            replica.replica_id,
            body,
            timeout_s=timeout_s,
        )

    async def _check(self, replica: ReplicaProcess, timeout_s: float) -> str:
        """Run the replica's health check: "" when healthy, else what went wrong."""
        try:
            status, body = await self._internal(replica, "GET", wire.HEALTHZ_PATH, b"", timeout_s)
        except TimeoutError:
            return f"no response within health_check_timeout_s={timeout_s:g}"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        if status == 200:
            # What the replica applied is the replica's to say (control/user_config.py).
            replica.applied_user_config = wire.applied_user_config(body) or ""
            return ""
        return f"HTTP {status}: {body[:500].decode('utf-8', 'replace')}"

    async def _reconfigure(self, replica: ReplicaProcess) -> None:
        replica.reconfiguring = True
        version = self.user_config_version
        body = json.dumps({"user_config": self.config.user_config}).encode()
        try:
            status, answer = await self._internal(
                replica, "POST", wire.RECONFIGURE_PATH, body, _RECONFIGURE_TIMEOUT_S
            )
            if status == 200:
                replica.applied_user_config = wire.applied_user_config(answer) or version
                self._ctx.records.applied_user_config(
                    replica.replica_id, replica.applied_user_config
                )
            else:
                text = answer[:1000].decode("utf-8", "replace")
                self.last_error = f"reconfigure failed on {replica.replica_id}: {text}"
                replica.healthy = False
        except (OSError, TimeoutError) as exc:
            self.last_error = f"reconfigure failed on {replica.replica_id}: {exc}"
        finally:
            replica.reconfiguring = False
            self._ctx.wake()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _stop_order(replicas: list[ReplicaProcess]) -> list[ReplicaProcess]:
    """Replicas to stop first: those not serving yet, then the newest."""
    return sorted(replicas, key=lambda r: (r.state == "RUNNING", -r.start_time_s))


def _settled(replica: ReplicaProcess) -> bool:
    """Running long enough for proxies and handles to know of it."""
    return time.monotonic() - replica.ready_at >= DISCOVERY_SETTLE_S


def _stopping(replica: ReplicaProcess) -> bool:
    """Whether the replica was asked to stop (its state changes under our feet across awaits)."""
    return replica.state in ("STOPPING", "STOPPED")
