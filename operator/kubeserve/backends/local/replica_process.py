"""One replica process on the local machine, which owns its lifecycle.

A :class:`ReplicaProcess` starts its process (or watches one adopted from an earlier run), waits
until it answers ``/-/healthz``, health-checks it every ``health_check_period_s``, pushes a
``user_config`` when told to, and stops it. It is the only writer of its own ``state``,
``healthy`` and ``applied_user_config``, and reports every change of ``state`` through one
callback, ``on_transition(replica, old, new, reason)``, which its deployment uses for failure
accounting and to wake the controller. The replica never decides to stop: its deployment does.


* ``STARTING -> RUNNING``: it answered its first health check;
* ``RUNNING -> RUNNING`` with ``healthy`` now False: it failed its health check
  ``HEALTH_CHECK_FAILURE_THRESHOLD`` times in a row (``reason`` is the error);
* ``STARTING | RUNNING -> STOPPING``: :meth:`stop` was called (``reason`` says why);
* ``any -> STOPPED``: the process is gone (``reason`` is "" after a requested stop, else why it
  failed: it could not start, or it exited on its own, with the tail of its log).

The ``user_config`` a replica applied is the replica's word: read from its health and reconfigure
answers (:mod:`kubeserve.control.user_config`), never remembered from a push.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeserve.backends.local import processes
from kubeserve.backends.local.capacity import NOSET_CUDA_ENV
from kubeserve.backends.local.limit_enforcement import ReplicaCgroup
from kubeserve.backends.local.process_records import ReplicaRecord
from kubeserve.backends.local.replica_context import ReplicaContext
from kubeserve.control import effective_config
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.replica_limits import out_of_memory_message, replica_limits
from kubeserve.control.status_derivation import ReplicaStateValue
from kubeserve.runtime import channel, metrics_merge, wire
from kubeserve.runtime.runtime_env import PreparedEnv

log = logging.getLogger(__name__)

#: How long one readiness probe of a starting replica may take.
_READY_TIMEOUT_S = 5.0
#: How long a replica's ``reconfigure`` may take before it counts as failed.
_RECONFIGURE_TIMEOUT_S = 300.0
#: How often a starting replica's ``/-/healthz`` is polled: short, because it bounds deploy latency.
_READY_POLL_S = 0.02

#: ``on_transition(replica, old, new, reason)``: see the module docstring.
OnTransition = Callable[["ReplicaProcess", ReplicaStateValue, ReplicaStateValue, str], None]


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica of one version starts with (the version covers all of it but the config's
    ``user_config``, which :attr:`ReplicaProcess.config` carries, current)."""

    app: str
    app_uid: str
    deployment: str
    import_path: str
    app_args: dict[str, Any]
    route_prefix: str | None
    env: PreparedEnv
    #: an imperative application's pickled graph (base64), loaded instead of ``import_path``
    app_graph: str | None = None
    #: the instance's ``http_options.root_path`` ("" for none)
    http_root_path: str = ""
    #: the instance's ``tracing_config`` when it enables tracing
    tracing_config: dict[str, Any] | None = None


@dataclass(eq=False)
class ReplicaProcess:
    replica_id: str
    version: str
    port: int
    log_path: Path
    #: the deployment's effective config, kept current by the deployment (health-check timing,
    #: graceful shutdown, the ``user_config`` a new process starts with)
    config: EffectiveDeployment
    context: ReplicaContext
    on_transition: OnTransition
    #: how log records name the deployment: ``app/deployment``
    label: str
    state: ReplicaStateValue = "STARTING"
    healthy: bool = True
    #: the user_config version the replica last reported applying ("" until its first answer)
    applied_user_config: str = ""
    #: the route prefix it reported serving under (None: not heard yet)
    applied_route_prefix: str | None = None
    reconfiguring: bool = False
    pid: int | None = None
    start_time_s: float = field(default_factory=time.time)
    #: ``time.monotonic()`` when it became RUNNING (0 before)
    ready_at: float = 0.0
    #: what it holds of the instance's resources (see :class:`Capacity`), released by its owner
    claim: dict[str, float] = field(default_factory=dict)
    #: the GPU devices it holds (its ``CUDA_VISIBLE_DEVICES``), released with its claim
    gpus: list[str] = field(default_factory=list)
    #: holds one of the instance's start slots (until it is ready or gone)
    holds_start_slot: bool = False
    proc: processes.Child | None = None
    #: what holds the process to its memory and process limits (``None``: nothing)
    cgroup: ReplicaCgroup | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, spec: ReplicaSpec) -> None:
        """Start the process and run its lifecycle in the background."""
        self._spawn(self._lifecycle(self._run(spec)))

    def watch(self, proc: processes.AdoptedProcess) -> None:
        """Run the lifecycle of a RUNNING replica an earlier run started."""
        self.proc, self.pid = proc, proc.pid
        self.cgroup = self._limits()
        self._spawn(self._lifecycle(self._watch(proc)))

    def stop(self, reason: str) -> None:
        """Stop gracefully (``graceful_shutdown_timeout_s``); idempotent."""
        if self.state in ("STOPPING", "STOPPED"):
            return
        self._transition("STOPPING", reason)
        self.context.records.remove_replica(self.replica_id)  # a draining replica is not adopted
        log.info("%s: stopping replica %s", self.label, self.replica_id)
        if self.proc is not None:
            timeout = self.config.graceful_shutdown_timeout_s
            self._spawn(processes.terminate(self.proc, timeout))

    async def reconfigure(self, user_config: Any, version: str, route_prefix: str) -> str:
        """Push ``user_config`` (whose version is ``version``) and the application's route
        prefix; "" when applied, else what went wrong. A replica that refuses it is no longer
        ``healthy``."""
        self.reconfiguring = True
        body = json.dumps({"user_config": user_config, "route_prefix": route_prefix}).encode()
        try:
            status, answer = await self._internal(
                "POST", wire.RECONFIGURE_PATH, body, _RECONFIGURE_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            return f"reconfigure failed on {self.replica_id}: {exc}"
        finally:
            self.reconfiguring = False
        if status != 200:
            text = answer[:1000].decode("utf-8", "replace")
            self.healthy = False
            return f"reconfigure failed on {self.replica_id}: {text}"
        self.applied_user_config = wire.applied_user_config(answer) or version
        self.applied_route_prefix = wire.applied_route_prefix(answer)
        self.context.records.applied_user_config(self.replica_id, self.applied_user_config)
        return ""

    @property
    def serving(self) -> bool:
        """Running, healthy: proxies and handles may send it requests."""
        return self.state == "RUNNING" and self.healthy

    def _transition(self, new: ReplicaStateValue, reason: str) -> None:
        old, self.state = self.state, new
        self.on_transition(self, old, new, reason)

    async def _lifecycle(self, body: Coroutine[Any, Any, str]) -> None:
        reason = ""
        try:
            reason = await body
        finally:
            self.context.records.remove_replica(self.replica_id)
            self._free_start_slot()
            self._transition("STOPPED", reason)

    def _gpu_env(self, spec: ReplicaSpec) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` naming exactly the devices given, as Ray sets it for an actor
        holding GPUs (unless ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` says not to)."""
        noset = spec.env.env_vars.get(NOSET_CUDA_ENV, os.environ.get(NOSET_CUDA_ENV, ""))
        if not self.gpus or noset.strip().lower() in ("1", "true", "yes"):
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}

    def _free_start_slot(self) -> None:
        if self.holds_start_slot:
            self.holds_start_slot = False
            self.context.capacity.started()
            self.context.wake()  # another replica may start now

    async def _run(self, spec: ReplicaSpec) -> str:
        try:
            config_fd = self._config_fd(spec)
        except OSError as exc:
            return f"could not write the replica's config: {exc}"
        ctx = self.context
        env = ctx.child_env(
            {
                **self._gpu_env(spec),
                **spec.env.env_vars,
                wire.REPLICA_CONFIG_FD_ENV: str(config_fd),
                wire.CONTROLLER_URL_ENV: ctx.controller_url,
                **ctx.data_plane_env(),
                **ctx.log_env(self.log_path),
            },
            spec.env.python_path,
        )
        try:
            self.cgroup = self._limits()
            proc = await processes.spawn(
                "kubeserve.runtime.replica",
                ["--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                log_path=self.log_path,
                cwd=spec.env.cwd or ctx.base_dir,
                pass_fds=(config_fd,),
                die_with_parent=ctx.die_with_parent,
                enter_limits=None if self.cgroup is None else self.cgroup.enter,
            )
        except OSError as exc:
            return f"could not start the replica process: {exc}"
        finally:
            os.close(config_fd)
        self.proc, self.pid = proc, proc.pid
        self._record(spec)
        log.info(
            "%s: started replica %s (pid %d, log %s, limits: %s)",
            self.label,
            self.replica_id,
            proc.pid,
            self.log_path,
            "none" if self.cgroup is None else self.cgroup.describe(),
        )
        if self.state in ("STOPPING", "STOPPED"):  # stopped while spawning
            await processes.terminate(proc, 1.0)
            return ""
        return await self._watch(proc)

    def _config_fd(self, spec: ReplicaSpec) -> int:
        """The replica's :class:`wire.ReplicaConfig`, with the *current* user_config, in an
        in-memory file: the descriptor the replica inherits (the caller closes its own copy).

        Not an environment variable: ``user_config`` has no size limit of its own, and the
        environment of ``execve`` fails with E2BIG past ~128 KiB per variable. Not a file on the
        disk either: a replica must start (after a crash, say) while the state disk is full, and
        the config (``user_config`` may hold credentials) is then never on the disk at all.
        """
        config = self.config
        replica_config: wire.ReplicaConfig = {
            "app": spec.app,
            "deployment": spec.deployment,
            "import_path": spec.import_path,
            "replica_id": self.replica_id,
            "user_config": config.user_config,
            "max_ongoing_requests": config.max_ongoing_requests,
            "graceful_shutdown_wait_loop_s": config.graceful_shutdown_wait_loop_s,
            "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
            "request_limits": self.context.request_limits.to_mapping(),
            "app_args": spec.app_args,
            "route_prefix": spec.route_prefix,
        }
        if spec.app_graph is not None:
            replica_config["app_graph"] = spec.app_graph
        if spec.http_root_path:
            replica_config["http_root_path"] = spec.http_root_path
        if config.logging_config:
            replica_config["logging_config"] = dict(config.logging_config)
        if spec.tracing_config:
            replica_config["tracing_config"] = spec.tracing_config
        if (router := wire.request_router_spec(config)) is not None:
            replica_config["request_router_class"] = router["request_router_class"]
        fd = os.memfd_create(f"kubeserve-replica-{self.replica_id}", os.MFD_CLOEXEC)
        try:
            data = memoryview(json.dumps(replica_config).encode())
            while data:
                data = data[os.write(fd, data) :]
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _record(self, spec: ReplicaSpec) -> None:
        """Record the process for the next ``kubeserve start`` (see :mod:`process_records`)."""
        assert self.pid is not None
        started = processes.start_time(self.pid)
        if started is None:
            return  # gone already: its lifecycle sees the exit
        self.context.records.put_replica(
            ReplicaRecord(
                replica_id=self.replica_id,
                app=spec.app,
                app_uid=spec.app_uid,
                deployment=spec.deployment,
                version=self.version,
                user_config_version=self.applied_user_config,
                port=self.port,
                pid=self.pid,
                start_time=started,
            )
        )

    async def _watch(self, proc: processes.Child) -> str:
        """Wait until the replica is ready (an adopted one is), health-check it until it exits,
        and say why it exited ("" when it was asked to)."""
        exited = asyncio.ensure_future(proc.wait())
        try:
            if self.state == "RUNNING" or await self._wait_ready(exited):
                await self._health_loop(exited)
            code = await exited
        finally:
            if not exited.done():
                exited.cancel()
            processes.kill_group(proc.pid)  # what the replica started dies with it
            metrics_merge.mark_process_dead(proc.pid, str(self.context.metrics_dir))
        out_of_memory = self._out_of_memory()
        if self.cgroup is not None:  # also what left the process group
            await self.cgroup.release()
        if self.state == "STOPPING":
            log.info("%s: replica %s stopped (exit code %s)", self.label, self.replica_id, code)
            return ""
        if out_of_memory:
            return out_of_memory
        tail = processes.log_tail(self.log_path)
        if self.state == "STARTING":
            return f"replica exited with code {code} before it was ready:\n{tail}"
        return f"replica {self.replica_id} exited unexpectedly with code {code}:\n{tail}"

    def _limits(self) -> ReplicaCgroup | None:
        enforcement = self.context.limits
        if enforcement is None:
            return None
        limits = replica_limits(self.config, self.context.max_processes)
        return enforcement.replica(self.replica_id, limits)

    def _out_of_memory(self) -> str:
        """Ray's ``OutOfMemoryError`` naming the limit, when the kernel killed the replica (or
        a process of it) for its memory; "" otherwise."""
        cgroup = self.cgroup
        if cgroup is None or not cgroup.out_of_memory():
            return ""
        message = out_of_memory_message(
            self.replica_id, cgroup.limits, cgroup.enforced_by, cgroup.peak_memory()
        )
        log.warning("%s: %s", self.label, message)
        return message

    async def _wait_ready(self, exited: asyncio.Future[int]) -> bool:
        async def probe() -> bool:
            return not await self._check(_READY_TIMEOUT_S)

        ready = await processes.wait_until_answering(
            probe, exited, lambda: self.state == "STARTING", _READY_POLL_S
        )
        self._free_start_slot()
        if ready:
            self.ready_at = time.monotonic()
            log.info("%s: replica %s is ready", self.label, self.replica_id)
            self._transition("RUNNING", "ready")
        return ready

    async def _health_loop(self, exited: asyncio.Future[int]) -> None:
        failures = 0
        threshold = effective_config.HEALTH_CHECK_FAILURE_THRESHOLD
        while self.state == "RUNNING":
            await asyncio.wait([exited], timeout=self.config.health_check_period_s)
            if exited.done() or self.state != "RUNNING":
                return
            error = await self._check(self.config.health_check_timeout_s)
            failures = failures + 1 if error else 0
            if error and failures < threshold:
                log.warning(
                    "%s: replica %s failed health check %d of %d in a row: %s",
                    self.label, self.replica_id, failures, threshold, error,
                )  # fmt: skip
            elif error:
                self.healthy = False
                message = f"replica {self.replica_id} failed its health check: {error}"
                log.warning("%s: %s", self.label, message)
                self._transition("RUNNING", message)
                return

    async def _check(self, timeout_s: float) -> str:
        """Run the replica's health check: "" when healthy, else what went wrong."""
        try:
            status, body = await self._internal("GET", wire.HEALTHZ_PATH, b"", timeout_s)
        except TimeoutError:
            return f"no response within health_check_timeout_s={timeout_s:g}"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        if status == 200:
            # What the replica applied is the replica's to say (control/user_config.py).
            self.applied_user_config = wire.applied_user_config(body) or ""
            self.applied_route_prefix = wire.applied_route_prefix(body)
            return ""
        return f"HTTP {status}: {body[:500].decode('utf-8', 'replace')}"

    async def read_metrics(self, timeout_s: float) -> dict[str, float] | None:
        """The replica's ``/-/metrics`` samples, or None when it does not answer them."""
        try:
            status, body = await self._internal("GET", wire.METRICS_PATH, b"", timeout_s)
        except (OSError, TimeoutError):
            return None
        if status != 200:
            return None
        return wire.parse_metrics(body.decode("utf-8", "replace"))

    async def _internal(
        self, method: str, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """One internal request to the replica over the authenticated channel."""
        return await channel.request(
            "127.0.0.1",
            self.port,
            method,
            path,
            self.context.secret,
            self.replica_id,
            body,
            timeout_s=timeout_s,
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
