"""``kubeserve proxy``: the command line of the proxy process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubeserve.runtime import channel, logs, tracing
from kubeserve.runtime.command_line import argument_parser
from kubeserve.runtime.discovery import EndpointSource
from kubeserve.runtime.fastpath import DATA_PATH_ENV, MISSING_BINARY, choose_data_path, find_binary
from kubeserve.runtime.limits import add_limit_arguments, limits_from_arguments
from kubeserve.runtime.proxy.server import LeavePlan, serve_proxy
from kubeserve.runtime.tls import PASSWORD_ENV, TLSFiles

__all__ = ["ClusterDiscovery", "main"]


@dataclass(frozen=True)
class ClusterDiscovery:
    """Where a proxy in a cluster learns routes and replicas instead of the local controller,
    given by the command's composition root (:mod:`kubeserve.runtime.kubernetes.pod`)."""

    #: the ``--discovery`` value that selects it
    name: str
    #: makes the source, only once selected (it may import a client the proxy otherwise skips)
    source: Callable[[], EndpointSource]
    #: the ``namespace/instance`` the proxy's load reports name
    scope: str
    #: given the source, returns once another proxy serves this one's clients (see
    #: :class:`~kubeserve.runtime.proxy.server.LeavePlan`)
    replaced: Callable[[EndpointSource], Awaitable[None]] | None = None


def main(
    argv: list[str] | None = None,
    *,
    cluster: ClusterDiscovery | None = None,
    metrics_port: int | None = None,
) -> int:
    """``kubeserve proxy``: the HTTP ingress process."""

    parser = argument_parser(prog="kubeserve proxy", description=main.__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--listen-fd",
        type=int,
        default=None,
        help="serve on this inherited listening socket (of --host/--port) instead of binding one",
    )
    parser.add_argument("--controller-url")
    discoveries = ("controller",) if cluster is None else ("controller", cluster.name)
    parser.add_argument("--discovery", choices=discoveries, default="controller")
    parser.add_argument("--request-timeout-s", type=float, default=None)
    parser.add_argument("--keep-alive-timeout-s", type=float, default=90.0)
    leaving = parser.add_argument_group("leaving, on SIGTERM (see LeavePlan)")
    leaving.add_argument(
        "--replacement-wait-s",
        type=float,
        default=0.0,
        help="in a cluster, serve on until another proxy is ready, waiting at most this long",
    )
    leaving.add_argument("--leave-delay-s", type=float, default=0.0, help="then serve on this long")
    leaving.add_argument(
        "--drain-timeout-s",
        type=float,
        default=0.0,
        help="then close keep-alive connections gracefully, letting requests finish this long",
    )
    parser.add_argument(
        "--logging-config",
        type=json.loads,
        default=None,
        help="Ray's logging_config as JSON: encoding, log_level, enable_access_log...",
    )
    parser.add_argument(
        "--tracing-config",
        type=json.loads,
        default=None,
        help="Ray's tracing_config as JSON: enabled, exporter_import_path, sampling_ratio",
    )
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", help=f"its key (PEM); a password in ${PASSWORD_ENV}")
    parser.add_argument("--ssl-ca-certs", help="require client certificates this CA signed")
    parser.add_argument(
        "--grpc-port", type=int, default=9000, help="grpc_options.port (with servicer functions)"
    )
    parser.add_argument(
        "--grpc-servicer-function",
        action="append",
        default=[],
        help="grpc_options.grpc_servicer_functions, one per flag: serve gRPC too",
    )
    parser.add_argument("--grpc-request-timeout-s", type=float, default=None)
    parser.add_argument(
        "--grpc-no-reflection",
        dest="grpc_reflection",
        action="store_false",
        help="grpc_options.enable_reflection false: do not answer gRPC server reflection",
    )
    parser.add_argument(
        "--data-path",
        # native unless told (not schema.config.DEFAULT_DATA_PATH: no pydantic in the proxy
        # process); kubeserve start and the operator pass --data-path python when they mean it
        choices=("python", "native"),
        default=os.environ.get(DATA_PATH_ENV) or None,
        help="native (the default): the kubeserve-fastpath process serves the requests it "
        "covers and hands the rest to this proxy; python: this proxy serves every request. "
        f"Default from ${DATA_PATH_ENV}, else native, or python when the binary is missing",
    )
    add_limit_arguments(parser)
    args = parser.parse_args(argv)
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    if args.discovery == "controller" and not args.controller_url:
        parser.error("--controller-url is required with --discovery controller")
    tls = None
    if args.ssl_certfile is not None:
        password = os.environ.pop(PASSWORD_ENV, None)
        tls = TLSFiles(args.ssl_certfile, args.ssl_keyfile, password, args.ssl_ca_certs)
    chosen = cluster if cluster is not None and args.discovery == cluster.name else None
    settings = logs.LogSettings(args.logging_config)
    component = logs.ComponentLog("proxy", "proxy", socket.gethostname())
    try:
        logs.configure(settings, component, logs.output_from_environment())
    except (OSError, ValueError) as exc:
        parser.error(f"cannot set up the log: {exc}")
    access = logs.AccessLog(component, settings.encoding) if settings.access_log else None
    try:  # as Ray's proxy, whose constructor raises: no serving without the tracing asked for
        tracing.setup(args.tracing_config, "proxy")
    except tracing.TracingSetupError as exc:  # one line, no usage: a pod's termination message
        parser.exit(1, f"kubeserve proxy: {exc.named()}\n")
    explicit = args.data_path
    native = choose_data_path(explicit, "native") == "native"
    if native and explicit is not None and find_binary() is None:
        parser.exit(1, f"kubeserve proxy: --data-path native: {MISSING_BINARY}\n")
    if native and tracing.ACTIVE is not None:  # the native data path makes no spans yet
        logging.getLogger(__name__).warning(
            "tracing_config enables tracing: serving without the native data path"
        )
        native = False
    try:
        secret = channel.take_secret()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        limits = limits_from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    grpc = None
    if args.grpc_servicer_function:
        from kubeserve.runtime.proxy.grpc_ingress import GrpcOptions, load_services

        options = GrpcOptions(
            args.grpc_port,
            tuple(args.grpc_servicer_function),
            args.grpc_request_timeout_s,
            args.grpc_reflection,
        )
        try:  # the user's modules must be importable here, as in Ray's proxy
            grpc = (options, load_services(options.servicer_functions))
        except Exception as exc:
            parser.error(f"cannot serve gRPC: {type(exc).__name__}: {exc}")

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal() -> None:  # a second signal does not wait for the leave
            if stop.is_set():
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        source = chosen.source() if chosen is not None else None
        replaced = None
        if chosen is not None and chosen.replaced is not None and source is not None:
            replaced = functools.partial(chosen.replaced, source)
        leave = LeavePlan(
            replaced, args.replacement_wait_s, args.leave_delay_s, args.drain_timeout_s
        )
        with contextlib.suppress(asyncio.CancelledError):
            await serve_proxy(
                args.host,
                args.port,
                args.controller_url,
                secret=secret,
                listen_fd=args.listen_fd,
                request_timeout_s=args.request_timeout_s,
                keep_alive_timeout_s=args.keep_alive_timeout_s,
                limits=limits,
                access_log=access,
                source=source,
                scope=chosen.scope if chosen is not None else None,
                metrics_port=metrics_port,
                grpc=grpc,
                tls=tls,
                stop=stop,
                leave=leave,
                native=native,
            )

    if native:
        # The native process serves the requests it covers; this one runs its supervisor,
        # discovery, the records it takes every 0.1 s and the requests handed to it, on asyncio's
        # own loop: uvloop (~2 MB of this process's resident memory) pays for itself where this
        # process serves every request, the Python data path.
        asyncio.run(run())
    else:
        import uvloop

        uvloop.run(run())
    return 0
