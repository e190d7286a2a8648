"""``kubeserve start``: the embedded instance on this machine (admin API, controller, proxy and
replicas, desired state in SQLite), and what ``kubeserve run`` shares with it.

Flags and environment become one :class:`~kubeserve.backends.local.controller.LocalSettings`
(plus the admin server's :class:`~kubeserve.api.security.AdminSecurity`); the instance then runs
until SIGINT or SIGTERM, or until what it was started to do (:data:`AfterStart`) fails.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeserve.cli.command import (
    AUTH_TOKEN_ENV,
    LOG_FORMAT,
    Command,
    add_auth_argument,
    auth_token,
    positive_int,
)
from kubeserve.control import placement
from kubeserve.control.replica_limits import DEFAULT_MAX_PROCESSES
from kubeserve.runtime.fastpath import (
    DATA_PATH_ENV,
    MISSING_BINARY,
    choose_data_path,
    find_binary,
)
from kubeserve.runtime.limits import add_limit_arguments, limits_from_arguments
from kubeserve.runtime.logs import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_BYTES
from kubeserve.runtime.python_env import GC_MIN_AGE_S
from kubeserve.schema import node_labels
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kubeserve.admin_client import AdminClient
    from kubeserve.api.security import AdminSecurity
    from kubeserve.backends.local.backend import LocalBackend

    #: what an embedded instance does once its admin API is up; ``-1``: keep serving, else
    #: stop with that exit code
    AfterStart = Callable[[AdminClient], Awaitable[int]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_instance_arguments(
        parser, Path(os.environ.get("KUBESERVE_STATE_DIR", Path.home() / ".kubeserve")), "0.0.0.0"
    )
    parser.add_argument("--deploy", type=Path, help="a config file to deploy once the server is up")


def run(args: argparse.Namespace) -> int:
    return start_instance(args, _deploy_file(args.deploy))


COMMAND = Command("start", "run kubeserve on this machine", add_arguments, run)


def add_instance_arguments(
    parser: argparse.ArgumentParser, state_dir: Path | None, http_host: str
) -> None:
    """The options of an embedded instance, shared by ``start`` and ``run``."""
    parser.add_argument(
        "--dashboard-host", default=os.environ.get("KUBESERVE_DASHBOARD_HOST", "127.0.0.1")
    )
    parser.add_argument(
        "--dashboard-port",
        type=int,
        default=int(os.environ.get("KUBESERVE_DASHBOARD_PORT", "8265")),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=state_dir,
        help="where the SQLite state, logs and runtime_env cache live"
        + ("" if state_dir else " (default: a new temporary directory, removed at exit)"),
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="proxy port of a serving layer started implicitly",
    )
    parser.add_argument(
        "--http-host", default=http_host, help="proxy host of a serving layer started implicitly"
    )
    add_auth_argument(
        parser,
        "require this bearer token on the admin API (default: $KUBESERVE_AUTH_TOKEN; "
        "required when --dashboard-host is not a loopback address)",
    )
    parser.add_argument(
        "--num-cpus",
        type=float,
        help="CPUs replicas may claim (ray_actor_options.num_cpus, 1 each by default); "
        "default: the machine's count, at least 16",
    )
    parser.add_argument(
        "--num-gpus",
        type=float,
        help="GPUs replicas may claim; default: CUDA_VISIBLE_DEVICES, else the NVIDIA GPUs found",
    )
    parser.add_argument(
        "--memory",
        type=positive_int,
        help="memory in bytes replicas may reserve (ray_actor_options.memory), as ray start "
        "--memory; default: the machine's (or this process's cgroup limit)",
    )
    parser.add_argument(
        "--resources",
        default="",
        help="custom resources replicas may claim (ray_actor_options.resources), as ray start "
        """--resources takes them: a JSON object such as '{"custom": 2}'""",
    )
    parser.add_argument(
        "--labels",
        default="",
        help='this node\'s labels, as ray start --labels takes them: "key1=val1,key2=val2" '
        "(replicas whose ray_actor_options.label_selector they do not satisfy wait)",
    )
    add_limit_arguments(parser)  # the proxy's and the replicas' RequestLimits
    parser.add_argument(
        "--replica-max-processes",
        type=positive_int,
        default=DEFAULT_MAX_PROCESSES,
        help="processes (threads included) each replica may run, so that a fork loop stays "
        f"inside its replica (default {DEFAULT_MAX_PROCESSES})",
    )
    parser.add_argument(
        "--runtime-env-keep-s",
        type=float,
        default=GC_MIN_AGE_S,
        help="seconds an unused runtime_env pip/uv environment is kept after its last use "
        f"before it is removed (default {GC_MIN_AGE_S:g}; uv's cache makes a rebuild cheap)",
    )
    parser.add_argument(
        "--reset-state",
        action="store_true",
        help="start with no applications: the state database (kubeserve.db) is renamed to "
        "kubeserve.db.reset-<time> in the state directory first (the way out of a corrupt one)",
    )
    parser.add_argument(
        "--data-path",
        choices=[d.value for d in DataPath],
        default=os.environ.get(DATA_PATH_ENV) or None,
        help="native: the proxy serves through the kubeserve-fastpath process (`make native`; "
        "see the README); python: the Python proxy serves every request. Default from "
        f"${DATA_PATH_ENV}, else {DEFAULT_DATA_PATH.value} (python, said once, when the "
        "binary is missing)",
    )
    parser.add_argument(
        "--log-max-bytes",
        type=positive_int,
        default=DEFAULT_LOG_BYTES,
        help="size at which a replica's or the proxy's log file is rotated (default 16 MiB)",
    )
    parser.add_argument(
        "--log-backups",
        type=positive_int,
        default=DEFAULT_LOG_BACKUPS,
        help="rotated log files kept per replica and proxy (default 4)",
    )


def _deploy_file(path: Path | None) -> AfterStart | None:
    """What ``kubeserve start --deploy FILE`` does once the admin API is up."""
    if path is None:
        return None

    async def deploy(client: AdminClient) -> int:
        code = await client.deploy(path)
        return -1 if code == 0 else code  # keep serving; a failure stops the instance

    return deploy


def start_instance(args: argparse.Namespace, after_start: AfterStart | None) -> int:
    """Run an embedded instance with the options of :func:`add_instance_arguments`."""
    import uvloop

    from kubeserve.api.security import (
        AdminSecurity,
        is_loopback,
        loopback_hosts,
        weak_token_problem,
    )
    from kubeserve.backends.local.backend import LocalBackend
    from kubeserve.backends.local.controller import LocalSettings
    from kubeserve.backends.local.state_lock import StateDirInUse
    from kubeserve.backends.local.store import CorruptStateError
    from kubeserve.backends.protocol import BackendError

    logging.basicConfig(level=os.environ.get("KUBESERVE_LOG_LEVEL", "INFO"), format=LOG_FORMAT)
    # read once, into LocalSettings.data_path: the proxy gets --data-path from there, and no
    # child inherits the variable (a proxy's own default would differ from the setting)
    os.environ.pop(DATA_PATH_ENV, None)
    data_path = DataPath(choose_data_path(args.data_path, DEFAULT_DATA_PATH.value))
    if data_path is DataPath.NATIVE and find_binary() is None:  # asked for explicitly
        print(f"kubeserve start: --data-path native: {MISSING_BINARY}", file=sys.stderr)
        return 2
    token = auth_token(args)
    # Replicas and builds inherit this environment and run user code: the token stays here.
    os.environ.pop(AUTH_TOKEN_ENV, None)
    loopback = is_loopback(args.dashboard_host)
    if not loopback and token is None:
        print(
            f"kubeserve start: refusing to serve the admin API on {args.dashboard_host} without "
            "authentication: it deploys code and is reachable from other machines there. Give a "
            f"token with --auth-token-file FILE or {AUTH_TOKEN_ENV}, or listen on loopback "
            "(--dashboard-host 127.0.0.1).",
            file=sys.stderr,
        )
        return 2
    weak = None if loopback or token is None else weak_token_problem(token)
    if weak is not None:
        print(
            f"kubeserve start: refusing to listen on {args.dashboard_host}: {weak}.",
            file=sys.stderr,
        )
        return 2
    security = AdminSecurity(
        auth_token=token,
        allowed_hosts=loopback_hosts(args.dashboard_host) if loopback else None,
    )
    host = "127.0.0.1" if args.dashboard_host in ("0.0.0.0", "::") else args.dashboard_host
    try:
        limits = limits_from_arguments(args)
        labels = node_labels.parse_labels(args.labels)
        resources = placement.custom_resources(args.resources)
    except ValueError as exc:
        print(f"kubeserve start: {exc}", file=sys.stderr)
        return 2
    settings = LocalSettings(
        state_dir=args.state_dir.resolve(),
        controller_url=f"http://{host}:{args.dashboard_port}",
        base_dir=os.getcwd(),
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        memory=args.memory,
        labels=labels,
        resources=resources,
        request_limits=limits,
        log_rotation=(args.log_max_bytes, args.log_backups),
        reset_state=args.reset_state,
        replica_max_processes=args.replica_max_processes,
        python_env_keep_s=max(0.0, args.runtime_env_keep_s),
        data_plane_outlives=not getattr(args, "temporary_state_dir", False),
        data_path=data_path,
    )
    try:
        backend = LocalBackend(settings)
    except (StateDirInUse, CorruptStateError, BackendError) as exc:
        print(f"kubeserve: {exc}", file=sys.stderr)
        return 1
    if backend.previous_state is not None:
        print(f"kubeserve: --reset-state: the previous state is kept at {backend.previous_state}")
    default_http = {"host": args.http_host, "port": args.http_port}
    return uvloop.run(
        _serve(
            backend,
            args.dashboard_host,
            args.dashboard_port,
            after_start,
            default_http,
            security,
        )
    )


async def _serve(
    backend: LocalBackend,
    host: str,
    port: int,
    after_start: AfterStart | None,
    default_http: dict[str, Any],
    security: AdminSecurity,
) -> int:
    from aiohttp import web

    from kubeserve.api.server import create_app

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await backend.start()
    runner = web.AppRunner(
        create_app(backend, default_http, security), access_log=None, shutdown_timeout=5
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        print(f"kubeserve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        await runner.cleanup()
        await backend.close()
        return 1
    print(
        f"kubeserve admin API on http://{host}:{port} (state in {backend.settings.state_dir})",
        flush=True,
    )
    code = 0
    if after_start is not None:
        from kubeserve.admin_client import AdminClient

        client = AdminClient(backend.settings.controller_url, security.auth_token)
        task = asyncio.ensure_future(after_start(client))
        await asyncio.wait(
            [task, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED"
        )
        if task.done() and task.result() >= 0:
            code = task.result()
            stop.set()
        elif not task.done():
            task.cancel()
    await stop.wait()
    print("kubeserve: stopping replicas and proxy", flush=True)
    # The backend first: proxies and replicas hold discovery long-polls open on the admin server,
    # which would otherwise hold up its shutdown until they time out.
    await backend.close()
    await runner.cleanup()
    return code
