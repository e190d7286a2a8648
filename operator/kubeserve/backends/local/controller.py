"""The local controller: one asyncio loop that reconciles the SQLite desired state into processes.

Level-triggered: every pass reads the whole desired state from the store, compares it with the
applications, deployments and proxy it observes, and acts. Passes run when something wakes the loop
(an apply, a replica becoming ready or dying, a failed health check) and at least once a second, so
a missed wake-up costs at most a second, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kubeserve.backends.local import adoption, processes
from kubeserve.backends.local.adoption import AdoptedReplica
from kubeserve.backends.local.application_state import ApplicationState
from kubeserve.backends.local.capacity import DEFAULT_START_SLOTS, Capacity, instance_resources
from kubeserve.backends.local.deployment_state import DeploymentState
from kubeserve.backends.local.limit_enforcement import Enforcement
from kubeserve.backends.local.private_files import private_dir
from kubeserve.backends.local.process_records import ProcessRecords
from kubeserve.backends.local.proxy_process import ProxyProcess
from kubeserve.backends.local.python_envs import PythonEnvCollector
from kubeserve.backends.local.replica_context import ReplicaContext, metrics_dir
from kubeserve.backends.local.snapshot import SnapshotPublisher
from kubeserve.backends.local.store import IMPERATIVE, DesiredState, Store
from kubeserve.control import autoscaling
from kubeserve.control.autoscaling_state import CallerReports
from kubeserve.control.instance import tracing_config
from kubeserve.control.replica_limits import DEFAULT_MAX_PROCESSES
from kubeserve.runtime import channel, metrics_merge, python_env, wire
from kubeserve.runtime import runtime_env as runtime_envs
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.logs import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_BYTES, RotatingLog
from kubeserve.runtime.tasks import cancel_and_wait
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath

log = logging.getLogger(__name__)
_RESYNC_S = 1.0
#: applications reconciled before a pass lets the event loop run other work
_APPS_PER_SLICE = 50
#: a pass longer than this is followed by as long a pause (small configs are never paced)
_PACE_AFTER_S = 0.01
#: How long proxies and handles keep the previous run's snapshot while replicas are adopted.
ADOPTION_DEADLINE_S = 60.0
#: the controller's own log file rotates at this size, keeping this many older files
CONTROLLER_LOG_BYTES = 16 * 1024 * 1024
CONTROLLER_LOG_BACKUPS = 4


@dataclass(frozen=True)
class LocalSettings:
    """Settings of ``kubeserve start``, built once by the CLI."""

    state_dir: Path
    #: the admin server's own URL, reachable from child processes (discovery long-poll)
    controller_url: str
    #: directory added to the children's import path (where ``kubeserve start`` was run)
    base_dir: str
    #: the instance's resources (``--num-cpus``/``--num-gpus``); ``None``: what the machine has
    #: (see :func:`kubeserve.backends.local.capacity.instance_resources`)
    num_cpus: float | None = None
    num_gpus: float | None = None
    #: bytes of memory replicas may reserve (``--memory``); ``None``: the machine's
    memory: float | None = None
    #: custom resources replicas may claim (``--resources``, ``ray_actor_options.resources``)
    resources: dict[str, float] = field(default_factory=dict)
    #: the node's labels (``--labels``), what ``ray_actor_options.label_selector`` is matched with
    labels: dict[str, str] = field(default_factory=dict)
    #: replicas of the whole instance starting at once
    max_concurrent_starts: int = DEFAULT_START_SLOTS
    #: what clients may send, enforced by the proxy and every replica
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    #: bytes per log file and rotated files kept, for each replica and proxy
    log_rotation: tuple[int, int] = (DEFAULT_LOG_BYTES, DEFAULT_LOG_BACKUPS)
    #: start from an empty state: the database is moved aside first (``--reset-state``)
    reset_state: bool = False
    #: processes (threads included) one replica may run (``--replica-max-processes``)
    replica_max_processes: int = DEFAULT_MAX_PROCESSES
    #: replicas and the proxy outlive this process when it is killed outright, for the next
    #: ``kubeserve start`` on the state directory to adopt; False (a temporary state directory,
    #: which no later start sees): they die with it
    data_plane_outlives: bool = True
    #: an unused runtime_env package environment used less than this ago is kept (seconds)
    python_env_keep_s: float = python_env.GC_MIN_AGE_S
    #: what serves the proxy's requests (``--data-path``)
    data_path: DataPath = DEFAULT_DATA_PATH

    @property
    def database(self) -> Path:
        return self.state_dir / "kubeserve.db"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def controller_log(self) -> Path:
        """The controller's log (every ``kubeserve.*`` logger of this process), rotated."""
        return self.log_dir / "controller.log"

    @property
    def run_dir(self) -> Path:
        """Where replicas' start-up files were kept before they were in-memory files (removed)."""
        return self.state_dir / "run"

    @property
    def cache_dir(self) -> Path:
        return self.state_dir / "runtime_env_cache"

    @property
    def secret_file(self) -> Path:
        """The instance's data-plane secret (see :mod:`kubeserve.runtime.channel`), mode 0600."""
        return self.state_dir / "data-plane.secret"


class Controller:
    def __init__(self, settings: LocalSettings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.snapshots = SnapshotPublisher()
        self.apps: dict[str, ApplicationState] = {}
        self.desired: DesiredState | None = None
        self.started_at = time.time()
        self.capacity = Capacity(
            instance_resources(
                settings.num_cpus, settings.num_gpus, settings.resources, settings.memory
            ),
            settings.max_concurrent_starts,
            labels=settings.labels,
        )
        self._wake = asyncio.Event()
        #: build processes running at once, as many as replicas starting at once
        self._builds = asyncio.Semaphore(settings.max_concurrent_starts)
        self._python_envs = PythonEnvCollector(
            settings.cache_dir / runtime_envs.PYTHON_ENVS, self.wake, settings.python_env_keep_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._log_handler: logging.Handler | None = None
        self._ctx: ReplicaContext | None = None
        self._proxy: ProxyProcess | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.secret = b""  # the data-plane secret, read at start()
        self.records: ProcessRecords | None = None
        #: replicas of an earlier run not yet handed to their deployment, by application name
        self._adoptable: dict[str, list[AdoptedReplica]] = {}
        self._adoption_deadline = 0.0
        #: the ``target_capacity`` of the last config, and where it heads
        self._capacity = autoscaling.CapacityTracker()
        self._autoscaling: set[asyncio.Task[None]] = set()
        self._stopping: set[asyncio.Task[None]] = set()
        #: deployment keys each caller last reported requests waiting for
        self._caller_reports = CallerReports()

    @property
    def proxy(self) -> ProxyProcess | None:
        return self._proxy if self._proxy is not None and self._proxy.running else None

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Adopt what an earlier run left serving (see :mod:`adoption`), kill the rest of it, and
        start reconciling. Proxies and handles keep the earlier run's snapshot until every
        adopted replica is back in a deployment: a restart changes nothing they see."""
        private_dir(self.settings.state_dir)
        private_dir(self.settings.log_dir)
        self._log_handler = _open_controller_log(self.settings.controller_log)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trust_env=False
        )
        secret_file = channel.create_secret_file(self.settings.secret_file)
        self.secret = channel.take_secret({channel.SECRET_FILE_ENV: str(secret_file)})
        self.records = ProcessRecords(self.settings.database)
        replicas = await adoption.find_replicas(self.records, self.secret)
        proxy = adoption.find_proxy(self.records)
        for adopted in replicas:
            self._adoptable.setdefault(adopted.record.app, []).append(adopted)
        self._adoption_deadline = time.monotonic() + ADOPTION_DEADLINE_S
        spared = {a.proc.pid for a in replicas} | ({proxy.proc.pid} if proxy else set())
        self._clean_up_previous_run(spared)
        if spared:
            log.info(
                "adopted %d replicas and %d proxy of an earlier run", len(replicas), bool(proxy)
            )
        self._open_snapshots_once_adopted()
        self._ctx = ReplicaContext(
            session=self._session,
            controller_url=self.settings.controller_url,
            capacity=self.capacity,
            state_dir=self.settings.state_dir,
            log_dir=self.settings.log_dir,
            base_dir=self.settings.base_dir,
            wake=self.wake,
            secret=self.secret,
            secret_file=secret_file,
            data_path=self.settings.data_path,
            records=self.records,
            die_with_parent=not self.settings.data_plane_outlives,
            request_limits=self.settings.request_limits,
            log_rotation=self.settings.log_rotation,
            limits=self._limit_enforcement({a.record.replica_id for a in replicas}),
            max_processes=self.settings.replica_max_processes,
        )
        self._proxy = ProxyProcess(self._ctx, proxy)
        self._loop_task = asyncio.ensure_future(self._loop())

    def _limit_enforcement(self, adopted: set[str]) -> Enforcement:
        """How replicas are held to their limits on this machine (said once in the log); the
        cgroups of replicas an earlier run left and nobody adopted are removed."""
        enforcement = Enforcement.detect(self.settings.state_dir)
        enforcement.sweep(adopted)
        log.info(
            "replica limits: %s; at most %d processes per replica",
            enforcement.describe(),
            self.settings.replica_max_processes,
        )
        return enforcement

    async def close(self) -> None:
        """Stop every process gracefully (desired state stays in the store for the next start)."""
        await cancel_and_wait(self._loop_task)
        for app in self.apps.values():
            app.begin_delete()
        await asyncio.gather(*(self._wait_app_stopped(a) for a in self.apps.values()))
        if self._proxy is not None:
            await self._proxy.stop()
        self._stop_adoptable(list(self._adoptable))
        if self._session is not None:
            await self._session.close()
        if self.records is not None:
            self.records.close()
        _kill_orphans(self.settings.state_dir, "left behind by processes of this run")
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        if self._log_handler is not None:
            logging.getLogger("kubeserve").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    @property
    def metrics_dir(self) -> Path:
        """Where the proxy and the replicas write their samples (``GET /metrics`` merges them)."""
        return metrics_dir(self.settings.state_dir)

    def metrics_exposition(self) -> bytes:
        """The Prometheus text of every process of the instance (Ray Serve's metric names)."""
        return metrics_merge.multiprocess_exposition(str(self.metrics_dir))

    def _clean_up_previous_run(self, adopted: set[int]) -> None:
        """Leave nothing of an earlier run but the ``adopted`` processes (and their groups).

        Its other processes (builds, replicas not adopted, what they started) are found by their
        environment and killed. The metrics directory is emptied only when nothing was adopted:
        adopted processes go on writing their samples there.
        """
        if not adopted:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)  # counters start with the run
        private_dir(self.metrics_dir)
        why = "left behind by an earlier run of this state dir"
        for pid in _kill_orphans(self.settings.state_dir, why, adopted):
            metrics_merge.mark_process_dead(pid, str(self.metrics_dir))
        shutil.rmtree(self.settings.run_dir, ignore_errors=True)

    def _handed_over(self, app: str, uid: str) -> list[AdoptedReplica]:
        """The adopted replicas of application ``app`` in its incarnation ``uid``; those of
        another incarnation are stopped."""
        adopted = self._adoptable.pop(app, [])
        self._stop_replicas([a for a in adopted if a.record.app_uid != uid])
        return [a for a in adopted if a.record.app_uid == uid]

    def _stop_adoptable(self, apps: list[str]) -> None:
        """Stop the adopted replicas of ``apps`` that no deployment took."""
        for app in apps:
            self._stop_replicas(self._adoptable.pop(app, []))

    def _stop_replicas(self, adopted: list[AdoptedReplica]) -> None:
        assert self.records is not None
        adoption.stop_unwanted(adopted, self.records, self._stopping)

    def _open_snapshots_once_adopted(self) -> None:
        """Publish snapshots once every adopted replica found its deployment (or the deadline
        passed): until then proxies and handles keep the earlier run's, which still holds."""
        pending = bool(self._adoptable) or any(not a.adoption_done for a in self.apps.values())
        if pending and time.monotonic() >= self._adoption_deadline:
            log.warning("adoption of an earlier run's replicas timed out: stopping the rest")
            for app in self.apps.values():
                app.stop_adoptable()
            pending = False
        if not pending:
            self.snapshots.open()

    async def _wait_app_stopped(self, app: ApplicationState) -> None:
        # Lifecycle tasks remove their replicas as processes exit; 50 ms polling bounds the wait.
        while not app.stopped:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            began = loop.time()
            try:
                await self.reconcile_once()
            except Exception:  # one bad pass must not stop the controller; the next one retries
                log.exception("reconcile pass failed")
            spent = loop.time() - began
            if spent > _PACE_AFTER_S:
                # A long pass (1,000 applications, whose builds end one after another and
                # wake it each time) is not run back to back: the admin API and the data
                # plane's long-polls get at least as long before the next one.
                await asyncio.sleep(spent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _RESYNC_S)

    async def reconcile_once(self) -> None:
        assert self._ctx is not None and self._proxy is not None
        desired = self.store.load()
        self.desired = desired
        wanted = {a.name: a for a in desired.applications} if desired else {}
        raw_capacity = desired.options.get("target_capacity") if desired else None
        capacity = self._capacity.update(
            wanted, None if raw_capacity is None else float(raw_capacity)
        )
        for name, app in list(self.apps.items()):
            if name not in wanted:
                app.begin_delete()
                if app.stopped:
                    del self.apps[name]
        for position, (name, stored) in enumerate(wanted.items(), 1):
            if position % _APPS_PER_SLICE == 0:
                # a pass over 1,000 applications takes ~100 ms: the admin API and the data
                # plane's long-polls are answered between slices, not after the whole pass
                await asyncio.sleep(0)
            existing = self.apps.get(name)
            if existing is not None and existing.uid != stored.uid:
                existing.begin_delete()  # deleted and created again since the last pass
            if existing is not None and existing.deleting and not existing.stopped:
                continue  # a re-created app waits for its previous incarnation to stop
            if existing is None or existing.deleting:
                existing = ApplicationState(
                    name, stored.uid, self._ctx, self.settings.cache_dir, self._builds
                )
                existing.adopt(self._handed_over(name, stored.uid))
                self.apps[name] = existing
            app = existing
            app.capacity = capacity
            options = desired.options if desired else {}
            app.http_root_path = str((options.get("http_options") or {}).get("root_path") or "")
            app.tracing_config = tracing_config(options)
            try:
                if app.config != stored.config or app.deployed_at != stored.deployed_at:
                    graph = self.store.graph(name) if stored.api_type == IMPERATIVE else None
                    app.set_config(stored.config, stored.deployed_at, graph)
                await app.reconcile()
            except Exception:  # one application's failure must not hold up the others
                log.exception("reconciling application %r failed", name)
        self._stop_adoptable([name for name in self._adoptable if name not in wanted])
        await self._reconcile_proxy(desired)
        self._open_snapshots_once_adopted()
        self._publish(desired)
        self._autoscale()
        self._collect_python_envs()

    def _collect_python_envs(self) -> None:
        wanted = set().union(*(app.python_envs() for app in self.apps.values()))
        adopted = not self._adoptable and all(a.adoption_done for a in self.apps.values())
        pids = [record.pid for record in self._ctx.records.replicas()] if self._ctx else []
        self._python_envs.after_pass(wanted, pids, ready=adopted)

    def _autoscale(self) -> None:
        """Start reading the load of every autoscaling deployment whose interval has come."""
        now = time.time()
        for app in self.apps.values():
            if app.deleting:
                continue
            for deployment in app.deployments.values():
                if deployment.scaling.due(now):
                    task = asyncio.ensure_future(deployment.scaling.read_and_decide())
                    self._autoscaling.add(task)
                    task.add_done_callback(self._autoscaling.discard)

    def deployment(self, app: str, name: str) -> DeploymentState | None:
        """A deployment of the current graph of a live application."""
        state = self.apps.get(app)
        if state is None or state.deleting:
            return None
        return state.deployments.get(name)

    def record_queued(self, caller_id: str, queued: dict[str, int]) -> None:
        """A caller's report: requests waiting per deployment key (see :class:`CallerReports`)."""
        for key, count in self._caller_reports.update(caller_id, queued).items():
            deployment = self.deployment(*wire.split_deployment_key(key))
            if deployment is not None:
                deployment.scaling.record_queued(caller_id, count)

    async def _reconcile_proxy(self, desired: DesiredState | None) -> None:
        assert self._proxy is not None
        location = desired.options.get("proxy_location", "EveryNode") if desired else "Disabled"
        if location == "Disabled":
            if self._proxy.running:
                await self._proxy.stop()
            return
        assert desired is not None
        http = desired.options.get("http_options") or {}
        options = {
            **http,
            "logging_config": desired.options.get("logging_config"),
            "tracing_config": tracing_config(desired.options),
            "grpc_options": desired.options.get("grpc_options") or {},
        }
        self._proxy.reconcile(
            str(http.get("host", "0.0.0.0")), int(http.get("port", 8000)), options
        )

    def _publish(self, desired: DesiredState | None) -> None:
        routes: list[wire.Route] = []
        endpoints: dict[str, wire.DeploymentEndpoints] = {}
        for app in self.apps.values():
            if app.deleting:
                continue
            ingress = app.ingress_name()
            prefix = app.route_prefix
            if ingress is not None and prefix is not None:
                routes.append({"route_prefix": prefix, "app": app.name, "deployment": ingress})
            status = app.status()
            for name, deployment in app.all_deployments().items():
                if deployment.has_target:
                    info = status.deployments.get(name)
                    endpoints[wire.deployment_key(app.name, name)] = deployment.endpoints(
                        wire.no_replica_coming(
                            app.name, status.status, name, info.status if info else None
                        )
                    )
        self.snapshots.publish(routes, endpoints, _proxy_timeouts(desired))

    @property
    def node_id(self) -> str:
        return f"local-{os.uname().nodename}"


def _proxy_timeouts(desired: DesiredState | None) -> wire.ProxyTimeouts | None:
    """The ``http_options`` timeouts the running proxy applies from its snapshot: a change
    takes effect without restarting it (the flags it was started with say the same at first)."""
    if desired is None:
        return None
    http = desired.options.get("http_options") or {}
    request_timeout = http.get("request_timeout_s")
    return {
        "request_timeout_s": None if request_timeout is None else float(request_timeout),
        "keep_alive_timeout_s": float(http.get("keep_alive_timeout_s", 90)),
    }


def _kill_orphans(state_dir: Path, why: str, spared_groups: set[int] | None = None) -> list[int]:
    killed = processes.kill_orphans(state_dir, spared_groups or set())
    if killed:
        log.warning("killed %d processes %s: pids %s", len(killed), why, killed)
    return killed


def _open_controller_log(path: Path) -> logging.Handler:
    """Copy this process's ``kubeserve.*`` log records into ``path``, rotated by size.

    The file is what the GET details name as the controller's ``log_file_path``; records still
    reach stderr through the root logger as before. Lines the disk refuses are dropped and
    counted (see :class:`kubeserve.runtime.logs.RotatingLog`).
    """
    handler = RotatingLog(str(path), CONTROLLER_LOG_BYTES, CONTROLLER_LOG_BACKUPS)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("kubeserve")
    logger.addHandler(handler)
    return handler
