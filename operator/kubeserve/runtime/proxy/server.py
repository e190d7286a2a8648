"""A running proxy: the listening socket, the shared state and the discovery feeding it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeserve.runtime.discovery import EndpointSource
from kubeserve.runtime.fastpath import FastPath, FastPathError, FastPathRefused
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.load_report import controller_links
from kubeserve.runtime.logs import AccessLog
from kubeserve.runtime.metrics import LATENCY_BUCKETS_MS
from kubeserve.runtime.metrics_listener import start_metrics_listener
from kubeserve.runtime.private_dir import PrivateDir
from kubeserve.runtime.proxy.client import ClientConnection
from kubeserve.runtime.proxy.state import ProxyState
from kubeserve.runtime.tasks import cancel_and_wait
from kubeserve.runtime.tls import ReloadingContext, TLSFiles, wait_for_files
from kubeserve.runtime.tls_stream import TLSServerProtocol
from kubeserve.runtime.wire import Snapshot

if TYPE_CHECKING:
    from kubeserve.runtime.proxy.grpc_ingress import GrpcIngress, GrpcOptions

__all__ = ["LeavePlan", "ProxyServer", "serve_proxy"]

log = logging.getLogger(__name__)

#: While a proxy drains, how long a client connection may idle before it is closed: a client
#: that sends its next request within it gets ``Connection: close`` on the answer instead.
_LEAVING_IDLE_S = 1.0
#: How often the requests the native data path answered are recorded into the metrics (and
#: access lines): a batch holds a tenth of a second of load, not a second of it, so decoding it
#: does not grow the proxy's resident memory by megabytes (its heap keeps the high-water mark);
#: the proxy already asks the native process every :data:`_NATIVE_LOAD_S` for its load.
_NATIVE_RECORDS_S = 0.1
#: How often this proxy and the native data path tell each other their requests in flight per
#: replica (both choose by the sum, against one ``max_ongoing_requests``).
_NATIVE_LOAD_S = 0.05
#: The largest request body and head the native data path forwards itself (larger: handed off).
_NATIVE_BODY = 64 * 1024
_NATIVE_HEAD = 16 * 1024


@dataclass(frozen=True)
class LeavePlan:
    """How a proxy leaves once told to stop (SIGTERM), so that no client request fails.

    In a cluster the proxy's Service keeps sending it new connections until kube-proxy learns
    that its pod terminates, and, when no other proxy is ready (the only proxy of a ``HeadOnly``
    instance, whose replacement starts as it terminates), until a replacement is. So the proxy
    serves on: first until ``replaced`` returns (another proxy is ready behind the Service; at
    most ``replacement_wait_s``), then ``delay_s`` more (kube-proxy's rules follow the
    EndpointSlice). Then it drains for at most ``drain_s``: it accepts no connection, answers
    every request with ``Connection: close``, closes connections idle for
    :data:`_LEAVING_IDLE_S`, and lets the requests in flight finish. The default (all zero,
    ``kubeserve start``) closes at once: its listening socket outlives the proxy.
    """

    replaced: Callable[[], Awaitable[None]] | None = None
    replacement_wait_s: float = 0.0
    delay_s: float = 0.0
    drain_s: float = 0.0


class ProxyServer:
    """A running proxy: the listening socket, the shared state and the discovery feeding it."""

    def __init__(
        self,
        host: str,
        port: int,
        controller_url: str | None = None,
        *,
        secret: bytes,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        limits: RequestLimits | None = None,
        source: EndpointSource | None = None,
        scope: str | None = None,
        listen_fd: int | None = None,
        grpc: tuple[GrpcOptions, dict[str, Any]] | None = None,
        tls: TLSFiles | None = None,
        native: bool = False,
    ) -> None:
        """``native``: serve through the native data path (``kubeserve proxy``'s default,
        :mod:`~kubeserve.runtime.fastpath`): the ``kubeserve-fastpath`` process takes
        ``host:port`` (or ``listen_fd``) and hands this proxy, listening on a private unix socket,
        what it does not cover (with ``tls``, it terminates TLS and hands off decrypted
        bytes).
        ``scope``: the ``namespace/instance`` the proxy's load reports name (in a cluster);
        ``tls``: serve HTTPS with these files (reloaded when they change, see
        :mod:`~kubeserve.runtime.tls`), plain HTTP when ``None``;
        ``listen_fd``: an inherited socket already listening on ``host:port`` (``kubeserve
        start`` keeps it open across proxy restarts); ``grpc``: the gRPC options and the
        services their servicer functions registered (:func:`~.grpc_ingress.load_services`),
        when the proxy also serves gRPC."""
        self.host = host
        self.port = port
        self.listen_fd = listen_fd
        self.tls = tls
        self.tls_context: ReloadingContext | None = None
        self.state = ProxyState(
            secret=secret,
            request_timeout_s=request_timeout_s,
            keep_alive_timeout_s=keep_alive_timeout_s,
            limits=limits,
        )
        #: the reporter tells the controller (local) or the operator (cluster) what waits here
        self.source, self.load_reporter = controller_links(
            controller_url, source, self.state.router, secret=secret, caller="a proxy", scope=scope
        )
        self._server: asyncio.Server | None = None
        #: the directory of the private unix socket behind the native data path
        self._private_dir: PrivateDir | None = None
        self.max_connections = self.state.limits.max_connections
        self.refused_connections = 0
        self._refusal_logged = -60.0
        self._grpc = grpc
        self.grpc: GrpcIngress | None = None
        self._native = native
        self.native: FastPath | None = None
        self._native_tasks: list[asyncio.Task[None]] = []
        self._native_snapshot: Snapshot | None = None
        self._native_changed = asyncio.Event()
        #: the version of the last snapshot the native process installed (-1: none yet)
        self.native_version = -1
        #: the TLS reload (``ReloadingContext.reloads``) whose files the native process serves
        self._native_tls = -1

    async def start(self) -> None:
        """Listen, wait (briefly) for the first snapshot, then accept; ``port=0`` picks a free
        port.

        Nothing is accepted before the routes are known (or late): a request for a configured
        route is never answered 404 by a proxy that has not loaded it yet. On an inherited
        socket, connections wait in its backlog meanwhile; requests that come before a late
        first snapshot are answered 503 with ``Retry-After`` (see ``exchange``).
        """
        self.max_connections = _connection_cap(self.state.limits.max_connections)
        if self.tls is not None:
            self.tls_context = await wait_for_files(self.tls, native=self._native)
            self.tls_context.start()
        if self._native:
            if self._grpc is not None:  # the native gRPC front hands calls to it: up first
                self.grpc = self._grpc_ingress(
                    *self._grpc, native=os.path.join(self._private_socket_dir(), "grpc.sock")
                )
                await self.grpc.start()
            await self._start_native()
            if self.native is None and self.grpc is not None:
                await self.grpc.close()
                self.grpc = None
        if self.native is None:
            self._server = await self._public_server()
            self.port = self._server.sockets[0].getsockname()[1]
        self.state.sweeper.start()
        if self.load_reporter is not None:
            self.load_reporter.start()
        if self.native is not None:
            self._native_tasks = [
                asyncio.create_task(self._native_sync(self.native)),
                asyncio.create_task(self._native_load(self.native)),
            ]
        if self._grpc is None:
            await self.source.start(self._apply)
        elif self.grpc is not None:  # behind the native front, started already
            await self.source.start(self._apply_both)
        else:
            self.grpc = self._grpc_ingress(*self._grpc)
            await self.source.start(self._apply_both)
            await self.grpc.start()
        assert self._server is not None
        await self._server.start_serving()

    async def _public_server(self) -> asyncio.Server:
        """This proxy on the client port (``listen_fd``, else ``host:port``), not serving yet."""
        loop = asyncio.get_running_loop()
        if self.listen_fd is not None:
            sock = socket.socket(fileno=self.listen_fd)
            sock.setblocking(False)
            return await loop.create_server(
                self._connection_factory(), sock=sock, backlog=4096, start_serving=False
            )
        return await loop.create_server(
            self._connection_factory(), self.host, self.port, backlog=4096, start_serving=False
        )

    async def _start_native(self) -> None:
        """Put the native process on the client port, this proxy behind it on a private unix
        socket (plain HTTP: the native process terminates TLS and hands off decrypted bytes).

        A certificate pair the native process does not load (a key rustls has no signer for,
        such as P-521 or Ed448) leaves the proxy on the Python path, said once.
        """
        loop = asyncio.get_running_loop()
        private = os.path.join(self._private_socket_dir(), "proxy.sock")
        self._server = await loop.create_unix_server(
            self._accept, private, backlog=4096, start_serving=False
        )
        tls = self.tls_context
        native = FastPath(
            self.state.secret,
            self.host,
            self.port,
            f"unix:{private}",
            listen_fd=self.listen_fd,
            tls=tls is not None,
            grpc=None
            if self.grpc is None or self._grpc is None
            else (self.host, self._grpc[0].port, self.grpc.address),
        )
        await native.start()
        if tls is not None:
            assert tls.native is not None
            try:
                await native.push_tls(tls.native)
            except FastPathRefused as exc:
                log.warning("serving without the native data path: %s", exc)
                await native.close()
                self._server.close()
                await self._server.wait_closed()
                self._server = None
                assert self._private_dir is not None
                self._private_dir.cleanup()
                self._private_dir = None
                return
            tls.on_reload = self._native_changed.set
            self._native_tls = tls.reloads
        self.native = native
        self.port = native.port

    def _private_socket_dir(self) -> str:
        """The directory of the private listeners behind the native process (made once).

        Unix sockets in a directory only this user may enter: another local process cannot
        reach this proxy's HTTP or gRPC server behind the native process's back (and skip what
        the client port checks, a client certificate for one)."""
        if self._private_dir is None:
            self._private_dir = PrivateDir("kubeserve-proxy-")
        return self._private_dir.name

    def _apply(self, snapshot: Snapshot) -> None:
        self.state.apply(snapshot)
        if self.native is not None:
            self._native_snapshot = snapshot
            self._native_changed.set()

    def _apply_both(self, snapshot: Snapshot) -> None:
        self._apply(snapshot)
        assert self.grpc is not None
        self.grpc.apply(snapshot)

    async def _native_sync(self, native: FastPath) -> None:
        """Push each new snapshot to the native process; every :data:`_NATIVE_RECORDS_S`,
        record the requests it answered into this proxy's metrics (Ray's names, served on
        ``/metrics``) and access lines."""
        state = self.state
        limits = state.limits
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_NATIVE_RECORDS_S):
                    await self._native_changed.wait()
            try:
                if self._native_changed.is_set():
                    self._native_changed.clear()
                    await self._native_push_tls(native)
                    snapshot = self._native_snapshot
                    assert snapshot is not None
                    await native.push(
                        snapshot,
                        keep_alive_timeout_s=state.keep_alive_timeout_s,
                        request_timeout_s=state.request_timeout_s,
                        header_timeout_s=limits.header_timeout_s,
                        body_timeout_s=limits.body_timeout_s,
                        max_body_bytes=min(limits.max_body_bytes or _NATIVE_BODY, _NATIVE_BODY),
                        max_head_bytes=min(limits.max_header_bytes, _NATIVE_HEAD),
                        max_url_bytes=limits.max_url_bytes,
                        latency_buckets_ms=list(LATENCY_BUCKETS_MS),
                        access_log=state.access_log is not None,
                        access_format=_native_format(state.access_log),
                        max_connections=self.max_connections,
                    )
                    if self.grpc is not None and native.grpc_port is not None:
                        await native.push_grpc(
                            snapshot,
                            self.grpc.native_methods(),
                            request_timeout_s=self.grpc.options.request_timeout_s,
                            latency_buckets_ms=list(LATENCY_BUCKETS_MS),
                            access_log=self.grpc.access_log is not None,
                            access_format=_native_format(self.grpc.access_log),
                        )
                    self.native_version = snapshot["version"]
                if self.grpc is not None and native.grpc_port is not None:
                    await self._native_grpc_records(native, self.grpc)
                await self._native_records(native)
            except FastPathError as exc:
                log.error("the native data path failed: %s", exc)
                return

    @staticmethod
    async def _native_grpc_records(native: FastPath, grpc: GrpcIngress) -> None:
        """Record the calls the native gRPC front answered as the Python ingress records its
        own (Ray's gRPC series; access lines, which it formats as this proxy's)."""
        records, access = await native.take_grpc_records()
        for record in records:
            deployment = record["key"].rpartition("#")[2]
            app = record["app"]
            grpc.metrics.add_batch(
                (record["method"], app, app, deployment, record["code"]),
                record["count"],
                record["total_ms"],
                record["buckets"],
            )
        if grpc.access_log is not None:
            grpc.access_log.write_lines(access)

    async def _native_records(self, native: FastPath) -> None:
        """Record what the native process answered (and refused) since the last call: metrics
        per label set, and its access lines, formatted there as this proxy's and written in one
        write (no Python object per request)."""
        state = self.state
        taken = await native.take_records()
        if taken.refused:
            self._refused(taken.refused)
        for record in taken.metrics:
            key = record["key"]
            route, application, deployment = state.labels.get(key) or ("", "", "")
            state.metrics.add_batch(
                (record["method"], route, application, deployment, record["status"]),
                record["count"],
                record["total_ms"],
                record["buckets"],
            )
        if state.access_log is not None:
            state.access_log.write_lines(taken.access)

    async def _native_load(self, native: FastPath) -> None:
        """Every :data:`_NATIVE_LOAD_S`, tell the native process this proxy's requests in
        flight per replica and count its own in this proxy's router
        (:meth:`~kubeserve.runtime.router.Router.set_external`) and in its ongoing-requests gauge:
        each side then chooses a replica by both counts, and a request the native process hands
        over when every replica is at ``max_ongoing_requests`` waits here for the first slot
        either side frees."""
        router = self.state.router
        metrics = self.state.metrics
        while True:
            try:
                theirs = await native.exchange_load(router.own_in_flight())
                router.set_external(theirs)
                metrics.set_elsewhere(sum(theirs.values()))
            except FastPathError:
                return  # (the records task logs it)
            await asyncio.sleep(_NATIVE_LOAD_S)

    async def _native_push_tls(self, native: FastPath) -> None:
        """Push the TLS files reloaded since the last push: new handshakes take them. Files the
        native process refuses leave it serving the previous ones, as the Python proxy does."""
        tls = self.tls_context
        if tls is None or tls.reloads == self._native_tls:
            return
        reloads = tls.reloads
        assert tls.native is not None
        try:
            await native.push_tls(tls.native)
        except FastPathRefused as exc:
            log.warning("TLS files reloaded but the native data path refused them: %s", exc)
        self._native_tls = reloads

    def _grpc_ingress(
        self, options: GrpcOptions, services: dict[str, Any], *, native: str | None = None
    ) -> GrpcIngress:
        """The gRPC listener: a server of its own, so the HTTP path is untouched by it (and an
        HTTP-only proxy never imports grpcio); ``native``: on this private unix socket, behind
        the native gRPC front."""
        from kubeserve.runtime.proxy.grpc_ingress import GrpcIngress

        return GrpcIngress(
            self.host,
            options,
            services,
            secret=self.state.secret,
            router=self.state.router,
            access_log=self.state.access_log,
            native=native,
        )

    def _connection_factory(self) -> Callable[[], asyncio.Protocol]:
        """What each accepted connection speaks to: :meth:`_accept`'s protocol, behind TLS
        (:mod:`~kubeserve.runtime.tls_stream`, not the event loop's own) when the proxy serves
        HTTPS. Each handshake takes the newest loaded context (the files may have been
        reloaded since the last one)."""
        tls = self.tls_context
        if tls is None:
            return self._accept
        return lambda: TLSServerProtocol(tls.current, self._accept())

    def _accept(self) -> asyncio.Protocol:
        """A new client connection, or the 503 of one over ``max_connections``."""
        if len(self.state.connections) < self.max_connections:
            return ClientConnection(self.state)
        self._refused(1)
        return _Refusal()

    def _refused(self, count: int) -> None:
        """``count`` connections were refused over ``max_connections`` (here, or by the native
        data path, which applies the same limit at its accept); logged once a minute."""
        self.refused_connections += count
        now = time.monotonic()
        if now - self._refusal_logged >= 60.0:
            self._refusal_logged = now
            log.warning(
                "refusing client connections: %d open, the limit (--max-connections); "
                "%d refused so far",
                self.max_connections,
                self.refused_connections,
            )

    async def leave(self, plan: LeavePlan) -> None:
        """Serve on, then drain, as ``plan`` says; :meth:`close` ends what is left."""
        loop = asyncio.get_running_loop()
        if plan.replaced is not None and plan.replacement_wait_s > 0:
            started = loop.time()
            try:
                await asyncio.wait_for(plan.replaced(), plan.replacement_wait_s)
                log.info("another proxy serves after %.1f s", loop.time() - started)
            except TimeoutError:
                log.warning("no other proxy ready after %.0f s: leaving", plan.replacement_wait_s)
        if plan.delay_s > 0:
            log.info("proxy leaving in %.1f s", plan.delay_s)
            await asyncio.sleep(plan.delay_s)
        if plan.drain_s <= 0 or self._server is None:
            return
        deadline = loop.time() + plan.drain_s
        native = self.native
        if native is None:
            self._server.close()  # no new connection; the open ones stay
        # (else the native process holds the client port and drains it, below; this proxy's
        # private listener stays open for what it hands over meanwhile)
        state = self.state
        state.leaving = True
        for conn in state.connections:  # requests not answered yet: ``Connection: close`` too
            if isinstance(conn, ClientConnection):
                for ex in (conn.active, *conn.pipeline):
                    if ex is not None and not ex.response_started:
                        ex.keep_alive = False
        state.set_timeouts(
            state.request_timeout_s, min(state.keep_alive_timeout_s, _LEAVING_IDLE_S)
        )
        if native is not None:
            try:
                if not await native.drain(plan.drain_s):
                    log.warning("the native data path did not drain in %.0f s", plan.drain_s)
            except FastPathError as exc:
                log.error("the native data path failed: %s", exc)
        while state.connections and loop.time() < deadline:  # noqa: ASYNC110 - a bounded poll
            await asyncio.sleep(0.05)
        log.info("proxy drained: %d connections left to close", len(state.connections))

    async def close(self) -> None:
        for task in self._native_tasks:
            await cancel_and_wait(task)
        self._native_tasks = []
        if self.native is not None:
            with contextlib.suppress(FastPathError):  # its last second
                await self._native_records(self.native)
            await self.native.close()
            self.native = None
        if self.grpc is not None:
            await self.grpc.close()
            self.grpc = None
        if self._server is not None:
            self._server.close()
        self.state.close()
        if self.load_reporter is not None:
            await self.load_reporter.close()
        await self.source.close()
        if self.tls_context is not None:
            await self.tls_context.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._private_dir is not None:
            self._private_dir.cleanup()
            self._private_dir = None


_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 40\r\n\r\n"
    b"too many open connections to this proxy\n"
)


class _Refusal(asyncio.Protocol):
    """A connection over the limit: the 503 is written at once, then the connection closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(_REFUSAL)  # type: ignore[attr-defined]
        transport.close()


def _native_format(access_log: AccessLog | None) -> dict[str, Any] | None:
    """How the native data path formats the access lines it hands over (None: it keeps none)."""
    return None if access_log is None else access_log.native_format()


def _connection_cap(wanted: int) -> int:
    """``wanted``, lowered to fit this process's file descriptors (soft limit raised to the hard
    one first): each client connection may hold an upstream one too, and some are kept spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, (soft - 128) // 2))


async def serve_proxy(
    host: str,
    port: int,
    controller_url: str | None,
    *,
    secret: bytes,
    request_timeout_s: float | None = None,
    keep_alive_timeout_s: float = 90,
    limits: RequestLimits | None = None,
    access_log: AccessLog | None = None,
    source: EndpointSource | None = None,
    scope: str | None = None,
    metrics_port: int | None = None,
    listen_fd: int | None = None,
    grpc: tuple[GrpcOptions, dict[str, Any]] | None = None,
    tls: TLSFiles | None = None,
    stop: asyncio.Event | None = None,
    leave: LeavePlan | None = None,
    native: bool = False,
) -> None:
    """Run a proxy until ``stop`` is set (``main`` sets it on SIGTERM/SIGINT) or cancelled;
    once stopped, it leaves as ``leave`` says (:meth:`ProxyServer.leave`).

    Endpoints come from the local controller (``controller_url``) or from ``source`` (in a
    cluster, the Kubernetes API, chosen by the command), where ``controller_url``, when given, is
    the operator's: load reports go there, naming ``scope``. ``metrics_port``: where to serve
    ``GET /metrics`` (:mod:`~kubeserve.runtime.metrics_listener`), if anywhere.
    """
    server = ProxyServer(
        host,
        port,
        controller_url,
        secret=secret,
        request_timeout_s=request_timeout_s,
        keep_alive_timeout_s=keep_alive_timeout_s,
        limits=limits,
        source=source,
        scope=scope,
        listen_fd=listen_fd,
        tls=tls,
        grpc=grpc,
        native=native,
    )
    server.state.access_log = access_log
    # first: while TLS files do not load the proxy waits, alive (a pod's liveness probe is here)
    metrics_listener = await start_metrics_listener(host, metrics_port, secret)
    await server.start()
    scheme = "https" if tls is not None else "http"
    log.info(
        "kubeserve proxy listening on %s://%s:%d%s",
        scheme,
        host,
        server.port,
        " (native data path)" if server.native is not None else "",
    )
    if server.grpc is not None:
        native_grpc = server.native.grpc_port if server.native is not None else None
        log.info(
            "kubeserve proxy serving gRPC on port %d%s",
            native_grpc or server.grpc.port,
            " (native gRPC front)" if native_grpc else "",
        )
    try:
        await (stop or asyncio.Event()).wait()
        if leave is not None:
            await server.leave(leave)
    finally:
        await server.close()
        if metrics_listener is not None:
            await metrics_listener.close()
        if access_log is not None:
            access_log.flush()
