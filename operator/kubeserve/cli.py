"""The ``kubeserve`` command: the embedded server, the data-plane processes and a small client.

The user-facing commands read their command line and environment here, build one settings object
and hand it to the layer that does the work. The data-plane processes (``proxy``, ``replica``,
``build``) are started by kubeserve itself, locally or in pods, and read the environment their
launcher sets; its names are in :mod:`kubeserve.runtime.wire`.

    kubeserve start      admin API + controller + proxy + replicas on this machine (SQLite state)
    kubeserve deploy     PUT a config file (YAML or JSON) to a running kubeserve
    kubeserve status     print application and deployment statuses
    kubeserve config     print the deployed application configs
    kubeserve shutdown   shut down every application
    kubeserve logs       print (or --follow) the logs of an application's replicas
    kubeserve proxy | replica | build   data-plane processes (started by kubeserve itself)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kubeserve.admin_client import AdminClient
    from kubeserve.api.security import AdminSecurity

    #: what an embedded instance does once its admin API is up; ``-1``: keep serving, else
    #: stop with that exit code
    AfterStart = Callable[[AdminClient, Any], Awaitable[int]]
from kubeserve.runtime.kubernetes.contract import NAMESPACE_ENV
from kubeserve.runtime.limits import add_limit_arguments, limits_from_arguments
from kubeserve.runtime.logs import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_BYTES
from kubeserve.sdk import ray_namespace

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: The admin API's bearer token, for ``kubeserve start`` and the client commands alike.
AUTH_TOKEN_ENV = "KUBESERVE_AUTH_TOKEN"


def main(argv: list[str] | None = None) -> int:
    ray_namespace.install()  # `import ray` in anything this process imports is kubeserve's
    parser = argparse.ArgumentParser(prog="kubeserve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    start = commands.add_parser("start", help="run kubeserve on this machine")
    _add_instance_arguments(
        start, Path(os.environ.get("KUBESERVE_STATE_DIR", Path.home() / ".kubeserve")), "0.0.0.0"
    )
    start.add_argument("--deploy", type=Path, help="a config file to deploy once the server is up")

    run = commands.add_parser(
        "run", help="run one application on this machine for development (like `serve run`)"
    )
    run.add_argument("import_path", help="module:application, e.g. app:app or app:build")
    run.add_argument("--name", default="default", help="the application's name")
    run.add_argument("--route-prefix", default="/")
    run.add_argument(
        "--reload",
        action="store_true",
        help="restart the replicas when a .py file under the working directory changes",
    )
    _add_instance_arguments(run, None, "127.0.0.1")

    operator = commands.add_parser("operator", help="run the Kubernetes operator")
    operator.add_argument(
        "--namespace",
        default=os.environ.get(NAMESPACE_ENV, "kubeserve-system"),
        help="the operator's own namespace (where the admin API writes custom resources)",
    )
    operator.add_argument(
        "--watch-namespaces",
        default=os.environ.get("KUBESERVE_WATCH_NAMESPACES", ""),
        help="comma-separated namespaces to watch; empty watches the whole cluster",
    )
    operator.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    operator.add_argument(
        "--dashboard-host",
        default="0.0.0.0",
        help="address(es) of the admin server, comma-separated (default: all)",
    )
    operator.add_argument("--dashboard-port", type=int, default=8265)
    operator.add_argument(
        "--report-url",
        default=os.environ.get("KUBESERVE_REPORT_URL") or None,
        help="the admin server's URL as the instances' pods reach it (the chart sets the "
        "operator's Service): they report requests waiting for replicas there, which lets "
        "deployments scale to zero (default: $KUBESERVE_REPORT_URL; unset, min_replicas 0 is "
        "refused)",
    )
    operator.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus /metrics here (0: off)"
    )
    operator.add_argument("--log-level", default=os.environ.get("KUBESERVE_LOG_LEVEL", "INFO"))

    for name, helptext in (
        ("deploy", "deploy a config file (multi-app if it has 'applications')"),
        ("status", "show statuses"),
        ("config", "show deployed configs"),
        ("shutdown", "shut everything down"),
        ("logs", "print the logs of an application's replicas (on kubeserve start's machine)"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument(
            "-a", "--address", default=os.environ.get("KUBESERVE_ADDRESS", DEFAULT_ADDRESS)
        )
        if name == "deploy":
            sub.add_argument("config_file", type=Path)
            sub.add_argument(
                "--wait",
                action="store_true",
                help="show progress until RUNNING (exit 0) or DEPLOY_FAILED/UNHEALTHY (exit 1)",
            )
            sub.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
        if name == "logs":
            sub.add_argument("app")
            sub.add_argument("deployment", nargs="?")
            sub.add_argument("-f", "--follow", action="store_true")
            sub.add_argument(
                "--tail", type=int, default=100, help="lines of each log to start with"
            )
        _add_auth_argument(sub, "send this bearer token (default: $KUBESERVE_AUTH_TOKEN)")

    fetch = commands.add_parser(
        "fetch-runtime-env", help="fetch working_dir / py_modules (a pod's init container)"
    )
    fetch.add_argument("--dest", type=Path, required=True)
    fetch.add_argument("--working-dir")
    fetch.add_argument("--py-module", action="append", default=[])

    for name in ("proxy", "replica", "build"):
        commands.add_parser(name, help=f"run a {name} process", add_help=False)

    args, rest = parser.parse_known_args(argv)
    if args.command == "proxy":
        from kubeserve.runtime.kubernetes import pod

        return pod.proxy(rest)
    if args.command == "replica":
        from kubeserve.runtime.kubernetes import pod

        return pod.replica(rest)
    if args.command == "build":
        from kubeserve.runtime.kubernetes import pod

        return pod.build(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "start":
        return _start(args, _deploy_file(args.deploy))
    if args.command == "run":
        return _run(args)
    if args.command == "operator":
        return _operator(args)
    if args.command == "fetch-runtime-env":
        return _fetch_runtime_env(args)
    return asyncio.run(_client(args))


def _add_instance_arguments(
    start: argparse.ArgumentParser, state_dir: Path | None, http_host: str
) -> None:
    """The options of an embedded instance, shared by ``start`` and ``run``."""
    start.add_argument(
        "--dashboard-host", default=os.environ.get("KUBESERVE_DASHBOARD_HOST", "127.0.0.1")
    )
    start.add_argument(
        "--dashboard-port",
        type=int,
        default=int(os.environ.get("KUBESERVE_DASHBOARD_PORT", "8265")),
    )
    start.add_argument(
        "--state-dir",
        type=Path,
        default=state_dir,
        help="where the SQLite state, logs and runtime_env cache live"
        + ("" if state_dir else " (default: a new temporary directory, removed at exit)"),
    )
    start.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="proxy port of a serving layer started implicitly",
    )
    start.add_argument(
        "--http-host", default=http_host, help="proxy host of a serving layer started implicitly"
    )
    _add_auth_argument(
        start,
        "require this bearer token on the admin API (default: $KUBESERVE_AUTH_TOKEN; "
        "required when --dashboard-host is not a loopback address)",
    )
    start.add_argument(
        "--num-cpus",
        type=float,
        help="CPUs replicas may claim (ray_actor_options.num_cpus, 1 each by default); "
        "default: the machine's count, at least 16",
    )
    start.add_argument(
        "--num-gpus",
        type=float,
        help="GPUs replicas may claim; default: CUDA_VISIBLE_DEVICES, else the NVIDIA GPUs found",
    )
    add_limit_arguments(start)  # the proxy's and the replicas' RequestLimits
    start.add_argument(
        "--log-max-bytes",
        type=_positive_int,
        default=DEFAULT_LOG_BYTES,
        help="size at which a replica's or the proxy's log file is rotated (default 16 MiB)",
    )
    start.add_argument(
        "--log-backups",
        type=_positive_int,
        default=DEFAULT_LOG_BACKUPS,
        help="rotated log files kept per replica and proxy (default 4)",
    )


def _add_auth_argument(parser: argparse.ArgumentParser, helptext: str) -> None:
    parser.add_argument("--auth-token-file", type=Path, metavar="FILE", help=helptext)


def _auth_token(args: argparse.Namespace) -> str | None:
    """The admin API's bearer token: ``--auth-token-file`` (surrounding whitespace stripped),
    else ``$KUBESERVE_AUTH_TOKEN``, else none. A missing or empty file stops the command."""
    path: Path | None = args.auth_token_file
    if path is None:
        return os.environ.get(AUTH_TOKEN_ENV) or None
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"kubeserve: cannot read --auth-token-file {path}: {exc}") from None
    if not token:
        raise SystemExit(f"kubeserve: --auth-token-file {path} is empty")
    return token


def _auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _deploy_file(path: Path | None) -> AfterStart | None:
    """What ``kubeserve start --deploy FILE`` does once the admin API is up."""
    if path is None:
        return None

    async def deploy(client: AdminClient, _backend: Any) -> int:
        code = await client.deploy(path)
        return -1 if code == 0 else code  # keep serving; a failure stops the instance

    return deploy


def _run(args: argparse.Namespace) -> int:
    """``kubeserve run``: an embedded instance with one application, in a temporary state
    directory unless ``--state-dir`` is given; with ``--reload`` a change to a ``.py`` file under
    the working directory gives the application a new source version, which rebuilds it and
    replaces its replicas (the old ones serve until the new ones are ready)."""
    import tempfile

    app = {"name": args.name, "route_prefix": args.route_prefix, "import_path": args.import_path}
    watched = Path.cwd()

    async def serve_app(client: AdminClient, _backend: Any) -> int:
        version = _source_version(watched)

        async def apply() -> int:
            env = {"env_vars": {SOURCE_VERSION_ENV: version}} if args.reload else {}
            config = {
                "http_options": {"host": args.http_host, "port": args.http_port},
                "applications": [{**app, "runtime_env": env}],
            }
            return await client.put(config, wait=True, source=args.import_path)

        url = f"http://{args.http_host}:{args.http_port}{args.route_prefix}"
        print(f"kubeserve run: {args.import_path} at {url}", flush=True)
        await apply()
        while args.reload:
            await asyncio.sleep(1.0)
            latest = _source_version(watched)
            if latest != version:
                version = latest
                print("kubeserve run: source changed, reloading", flush=True)
                await apply()
        return -1

    if args.state_dir is not None:
        return _start(args, serve_app)
    with tempfile.TemporaryDirectory(prefix="kubeserve-run-") as tmp:
        args.state_dir = Path(tmp)
        return _start(args, serve_app)


#: set in a ``kubeserve run --reload`` application's environment: the hash of its source files
SOURCE_VERSION_ENV = "KUBESERVE_SOURCE_VERSION"


def _source_version(root: Path) -> str:
    """A fingerprint of the ``.py`` files under ``root`` (names, sizes, modification times)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
            continue
        with contextlib.suppress(OSError):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _start(args: argparse.Namespace, after_start: AfterStart | None) -> int:
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

    logging.basicConfig(
        level=os.environ.get("KUBESERVE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    token = _auth_token(args)
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
    except ValueError as exc:
        print(f"kubeserve start: {exc}", file=sys.stderr)
        return 2
    settings = LocalSettings(
        state_dir=args.state_dir.resolve(),
        controller_url=f"http://{host}:{args.dashboard_port}",
        base_dir=os.getcwd(),
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        request_limits=limits,
        log_rotation=(args.log_max_bytes, args.log_backups),
    )
    try:
        backend = LocalBackend(settings)
    except StateDirInUse as exc:
        print(f"kubeserve: {exc}", file=sys.stderr)
        return 1
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
    backend: Any,
    host: str,
    port: int,
    after_start: AfterStart | None,
    default_http: dict[str, Any],
    security: AdminSecurity,
) -> int:
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
        task = asyncio.ensure_future(after_start(client, backend))
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


def _fetch_runtime_env(args: argparse.Namespace) -> int:
    from kubeserve.runtime.runtime_env import RuntimeEnvError, fetch_into

    try:
        asyncio.run(fetch_into(args.dest, args.working_dir, args.py_module))
    except RuntimeEnvError as exc:
        print(f"kubeserve fetch-runtime-env: {exc}", file=sys.stderr)
        return 1
    return 0


def _operator(args: argparse.Namespace) -> int:
    import uvloop

    from kubeserve.backends.kubernetes.operator import OperatorSettings

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it from there
    settings = OperatorSettings(
        namespace=args.namespace,
        watch_namespaces=tuple(n for n in args.watch_namespaces.split(",") if n),
        kubeconfig=args.kubeconfig,
        report_url=args.report_url,
    )
    return uvloop.run(
        _operate(settings, args.dashboard_host, args.dashboard_port, args.metrics_port)
    )


async def _operate(settings: Any, host: str, port: int, metrics_port: int = 0) -> int:
    import kopf

    from kubeserve.api.server import create_app
    from kubeserve.backends.kubernetes.admin_auth import KubernetesAuthorizer
    from kubeserve.backends.kubernetes.backend import KubernetesBackend
    from kubeserve.backends.kubernetes.handlers import register
    from kubeserve.backends.kubernetes.operator import Operator

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    operator = Operator(settings)
    await operator.start()
    assert operator.cluster is not None
    if settings.watch_namespaces and settings.namespace not in settings.watch_namespaces:
        logging.getLogger(__name__).warning(
            "the admin API writes to namespace %s, which the operator does not watch: "
            "GET /api/serve/applications/ will not see what it deploys",
            settings.namespace,
        )
    backend = KubernetesBackend(
        operator.cluster.kube, operator.cluster.cache, settings.namespace, reports=operator
    )
    authorizer = KubernetesAuthorizer(operator.cluster.kube, settings.namespace)
    admin = create_app(backend, middlewares=[authorizer.middleware])
    runner = web.AppRunner(admin, access_log=None, shutdown_timeout=5)
    await runner.setup()
    for one_host in host.split(","):
        await web.TCPSite(runner, one_host.strip(), port).start()
    metrics_runner: web.AppRunner | None = None
    if metrics_port:

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(text=operator.metrics(), content_type="text/plain")

        metrics_app = web.Application()
        metrics_app.add_routes([web.get("/metrics", metrics)])
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        for one_host in host.split(","):
            await web.TCPSite(metrics_runner, one_host.strip(), metrics_port).start()
    registry = kopf.OperatorRegistry()
    register(registry, operator)
    namespaces = list(settings.watch_namespaces)
    stop_flag: asyncio.Future[None] = loop.create_future()

    def _stop(_task: object) -> None:
        if not stop_flag.done():
            stop_flag.set_result(None)

    stop_task = asyncio.ensure_future(stop.wait())
    stop_task.add_done_callback(_stop)
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            stop_flag=stop_flag,
        )
    finally:
        stop_task.cancel()
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await operator.close()
    return 0


async def _client(args: argparse.Namespace) -> int:
    from kubeserve.admin_client import AdminClient

    client = AdminClient(args.address, _auth_token(args))
    if args.command == "deploy":
        return await client.deploy(args.config_file, wait=args.wait, timeout_s=args.timeout)
    if args.command == "logs":
        return await client.logs(args.app, args.deployment, follow=args.follow, tail=args.tail)
    return await client.show(args.command)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
