"""The HTTP ingress: routes client requests to replicas and streams the answers back.

Built on ``asyncio.Protocol`` and httptools rather than a web framework, because the proxy sits on
every request: a framework server forwarding through a framework client costs two full request
objects, a task and several buffers per request. Here a request costs one :class:`_Exchange` and
the bytes it carries. The tricks, each marked where it is used:

* **Synchronous fast path**: routing, the replica choice (``Router.try_assign``) and taking a pooled
  upstream connection happen inside ``data_received``; a task exists only when a request must wait
  for a slot or a new connection.
* **Bytes through**: the request line, headers and body are forwarded as the bytes httptools hands
  us; only hop-by-hop headers are dropped and chunked bodies re-framed piece by piece (never
  buffered whole).
* **Write coalescing**: everything one ``data_received`` produces for the other side goes out in one
  ``writelines`` (one syscall), e.g. head and body of a small response together.
* **Pooled keep-alive upstream connections**, per replica, LIFO so the warmest is reused; to a
  replica on the same host over its unix socket (:mod:`~kubeserve.runtime.local_socket`), which
  costs the kernel much less per request than loopback TCP.
* **Backpressure both ways**: a side whose write buffer fills pauses reading on the other side.
* **Lazy idle timer**: one timer per client connection that re-arms itself, instead of cancelling
  and creating a timer per request.

Ownership: a :class:`ClientConnection` owns its exchanges (the one being forwarded and any pipelined
behind it); an exchange owns its router slot (released exactly once, in :meth:`_Exchange._finish`
or :meth:`_Exchange._abort`) and its upstream connection until it hands it back to the pool.
:class:`ProxyState` owns the route table, the router and the pools; discovery replaces them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from collections import deque
from typing import cast

import httptools

from kubeserve.control.routes import RouteTable
from kubeserve.runtime import local_socket
from kubeserve.runtime.discovery import Discovery, EndpointSource
from kubeserve.runtime.http1 import (
    CHUNKED_END,
    HeaderKind,
    chunk_prefix,
    classify_header,
    local_response,
)
from kubeserve.runtime.router import NoReplicaAvailable, Replica, Router
from kubeserve.runtime.wire import HEALTHZ_PATH, Snapshot, deployment_key

__all__ = ["DEFAULT_ASSIGN_TIMEOUT_S", "ProxyServer", "ProxyState", "main", "serve_proxy"]

log = logging.getLogger(__name__)

#: How long a request waits for a replica slot when no request timeout is configured.
DEFAULT_ASSIGN_TIMEOUT_S = 30.0
ROUTES_PATH = "/-/routes"
# Request body bytes kept to replay the request on another replica after a connection failure.
_RETRY_BUFFER_LIMIT = 64 * 1024
# Body bytes buffered while waiting for an upstream connection before the client is paused.
_PENDING_HIGH_WATER = 256 * 1024
_CRLF = b"\r\n"
_HEAD = b"HEAD"
_CONNECTION_CLOSE = b"Connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"Connection: keep-alive\r\n"

_HEALTHY = local_response(200, b"success")
_UNHEALTHY = local_response(503, b"no snapshot from the controller yet")
_INTERNAL_404 = local_response(404, b"Not Found")


class ProxyState:
    """What every client connection of one proxy shares.

    Invariants: ``routes`` and ``routes_response`` are swapped together by :meth:`apply` (one
    snapshot at a time, on the loop); ``pools`` holds one :class:`_UpstreamPool` per replica of the
    current snapshot, created lazily; a pool whose replica left is closed and forgotten.
    """

    def __init__(
        self,
        *,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        router: Router | None = None,
    ) -> None:
        self.router = router or Router()
        self.routes = RouteTable()
        self.keys: dict[str, str] = {}  # route_prefix -> deployment key, computed once per snapshot
        self.routes_response = local_response(200, b"{}", content_type=b"application/json")
        self.healthy = False
        self.request_timeout_s = request_timeout_s
        self.assign_timeout_s = request_timeout_s or DEFAULT_ASSIGN_TIMEOUT_S
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.pools: dict[str, _UpstreamPool] = {}
        self.connections: set[ClientConnection] = set()

    def apply(self, snapshot: Snapshot) -> None:
        """Install a discovery snapshot (the ``on_update`` callback)."""
        self.routes = RouteTable(snapshot["routes"])
        self.keys = {
            r["route_prefix"]: deployment_key(r["app"], r["deployment"]) for r in self.routes.routes
        }
        body = json.dumps(self.routes.prefixes()).encode()
        self.routes_response = local_response(200, body, content_type=b"application/json")
        self.router.update(snapshot["deployments"])
        live = {ep["replica_id"] for d in snapshot["deployments"].values() for ep in d["replicas"]}
        for replica_id in [rid for rid in self.pools if rid not in live]:
            self.pools.pop(replica_id).close()
        self.healthy = True

    def pool(self, replica: Replica) -> _UpstreamPool:
        pool = self.pools.get(replica.replica_id)
        if pool is None or pool.host != replica.host or pool.port != replica.port:
            if pool is not None:
                pool.close()
            pool = self.pools[replica.replica_id] = _UpstreamPool(replica.host, replica.port)
        return pool

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        for conn in list(self.connections):
            conn.close()


class _UpstreamPool:
    """Idle keep-alive connections to one replica (LIFO: the most recently used is reused first)."""

    __slots__ = ("closed", "host", "idle", "port")

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[UpstreamConnection] = []
        self.closed = False

    def take(self) -> UpstreamConnection | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection: the replica's same-host unix socket when it has one, else TCP."""
        factory = lambda: UpstreamConnection(self)  # noqa: E731
        conn = await local_socket.connect(factory, self.host, self.port)
        if conn is None:
            _, conn = await asyncio.get_running_loop().create_connection(
                factory, self.host, self.port
            )
        return conn

    def put(self, conn: UpstreamConnection) -> None:
        if self.closed:
            conn.close()
        else:
            self.idle.append(conn)

    def discard(self, conn: UpstreamConnection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class _Exchange:
    """One client request and its response, from the first request byte to the last response byte.

    Request-side fields are written by the client connection's parser callbacks; response-side
    fields by the upstream connection's. ``pending`` holds framed request bytes not yet written
    upstream (before a connection is attached); ``sent`` keeps what was written, while small, so a
    failed connection can be replayed on another replica.
    """

    __slots__ = (
        "body_chunked",
        "client",
        "head",
        "head_done",
        "http10",
        "keep_alive",
        "key",
        "method",
        "pending",
        "pending_bytes",
        "replica",
        "request_done",
        "response_done",
        "response_started",
        "retried",
        "sent",
        "sent_bytes",
        "task",
        "timer",
        "upstream",
        "url",
    )

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.url = b""
        self.head = bytearray()
        self.head_done = False
        self.key = ""
        self.method = b""
        self.keep_alive = True
        self.http10 = False
        self.body_chunked = False
        self.request_done = False
        self.response_started = False
        self.response_done = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.sent: list[bytes] | None = []
        self.sent_bytes = 0
        self.replica: Replica | None = None
        self.upstream: UpstreamConnection | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.retried = False

    # -- request side ----------------------------------------------------------------------------

    def add_body(self, body: bytes) -> None:
        if self.response_done:  # answered locally (error, health): the rest is read and dropped
            return
        if self.body_chunked:
            self.pending += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.pending.append(body)
        self.pending_bytes += len(body)

    def end_body(self) -> None:
        self.request_done = True
        if self.body_chunked and not self.response_done:
            self.pending.append(CHUNKED_END)

    def start(self) -> None:
        """Route the request (its head is complete). Called once, when it becomes the active one."""
        state = self.client.state
        path = self.url.partition(b"?")[0].decode("latin-1")
        if path.startswith("/-/"):
            if path == HEALTHZ_PATH:
                self.respond_local(_HEALTHY if state.healthy else _UNHEALTHY)
            elif path == ROUTES_PATH:
                self.respond_local(state.routes_response)
            else:  # replica internals are never reachable from clients
                self.respond_local(_INTERNAL_404)
            return
        route = state.routes.match(path)
        if route is None:
            body = (
                f"Path '{path}' not found. Ping http://.../-/routes for available routes."
            ).encode()
            self.respond_local(local_response(404, body))
            return
        key = self.key = state.keys[route["route_prefix"]]
        if state.request_timeout_s is not None:
            self.timer = asyncio.get_running_loop().call_later(
                state.request_timeout_s, self._timed_out
            )
        # Fast path: a free slot and an idle connection need no task at all.
        replica = state.router.try_assign(key)
        if replica is not None:
            self.replica = replica
            conn = state.pool(replica).take()
            if conn is not None:
                self._attach(conn)
                return
        self.task = asyncio.create_task(self._connect(key))

    async def _connect(self, key: str, avoid: Replica | None = None) -> None:
        state = self.client.state
        try:
            if self.replica is None:
                self.replica = await state.router.assign(key, state.assign_timeout_s, avoid)
            pool = state.pool(self.replica)
            conn = pool.take() or await pool.connect()
        except NoReplicaAvailable as exc:
            self.task = None
            self.respond_local(local_response(503, str(exc).encode()))
            return
        except OSError:
            self.task = None
            self.upstream_failed()
            return
        self.task = None
        if self.client.closed:  # the client left while we were connecting
            conn.close()
            return
        self._attach(conn)

    def _attach(self, conn: UpstreamConnection) -> None:
        self.upstream = conn
        conn.exchange = self
        out: list[bytes] = [bytes(self.head)]
        out += self.pending
        self._remember(out)
        conn.transport.writelines(out)
        self.pending.clear()
        self.pending_bytes = 0
        self.client.update_reading()

    def pump(self) -> None:
        """Write request bytes parsed since the last call to the upstream connection, if any."""
        if self.pending and self.upstream is not None:
            self._remember(self.pending)
            self.upstream.transport.writelines(self.pending)
            self.pending.clear()
            self.pending_bytes = 0

    def _remember(self, pieces: list[bytes]) -> None:
        if self.sent is None:
            return
        for piece in pieces:
            self.sent_bytes += len(piece)
        if self.sent_bytes > _RETRY_BUFFER_LIMIT or self.retried:
            self.sent = None
        else:
            self.sent += pieces

    # -- response side ---------------------------------------------------------------------------

    def upstream_failed(self) -> None:
        """The upstream connection failed before any response byte: retry once, else 502."""
        state = self.client.state
        failed = self.replica
        self.upstream = None
        if failed is not None:
            state.router.release(failed)
            self.replica = None
        if self.client.closed:
            return
        if not self.retried and self.sent is not None and failed is not None:
            self.retried = True
            # Replay what was already sent, then whatever is still pending.
            self.pending[:0] = self.sent[1:]
            self.pending_bytes = sum(len(p) for p in self.pending)
            self.sent = []
            self.sent_bytes = 0
            self.task = asyncio.create_task(self._connect(self.key, avoid=failed))
            return
        self.respond_local(local_response(502, b"upstream replica failed", close=True), close=True)

    def upstream_lost_mid_response(self) -> None:
        """The replica died after the response began: the client can only be told by closing."""
        self.upstream = None
        self.client.close()

    def response_complete(self, reusable: bool) -> None:
        conn = self.upstream
        self.response_done = True
        if conn is not None:
            conn.exchange = None
            self.upstream = None
            # A connection paused for a slow client, or with request bytes unsent, is not reused.
            if reusable and self.request_done and not self.client.write_paused:
                conn.pool.put(conn)
            else:
                conn.close()
        if self.request_done:
            self._finish()

    def respond_local(self, response: bytes, close: bool = False) -> None:
        """Answer without a replica (health, routes, 404, 503, 502, 504).

        With ``close`` the connection ends after the answer, even if the request body is still
        arriving; otherwise the rest of the body is read and dropped, and keep-alive goes on.
        """
        self.response_started = self.response_done = True
        self.pending.clear()
        self.pending_bytes = 0
        self.client.write(response)
        if self.replica is not None:
            self.client.state.router.release(self.replica)
            self.replica = None
        if self.upstream is not None:
            self.upstream.exchange = None
            self.upstream.close()
            self.upstream = None
        if close:
            self.keep_alive = False
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.client.close()
        elif self.request_done:
            self._finish()

    def _timed_out(self) -> None:
        self.timer = None
        if self.response_started:
            self.abort()
            self.client.close()
        else:
            if self.task is not None:
                self.task.cancel()
                self.task = None
            if self.replica is None:  # still queued for a slot: that is unavailability, 503
                self.respond_local(local_response(503, b"no replica available in time"))
            else:
                timeout = local_response(504, b"request timed out", close=True)
                self.respond_local(timeout, close=True)

    def _finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.replica is not None:
            self.client.state.router.release(self.replica)
            self.replica = None
        self.client.exchange_finished(self)

    def abort(self) -> None:
        """The client left: give back the slot, drop the upstream connection, stop waiting."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
        if self.upstream is not None:
            self.upstream.exchange = None
            self.upstream.close()
            self.upstream = None
        if self.replica is not None:
            self.client.state.router.release(self.replica)
            self.replica = None
        self.response_done = True


class ClientConnection(asyncio.Protocol):
    """One client connection: parses requests with httptools and drives their exchanges in order.

    Invariant: ``active`` is the exchange being forwarded; pipelined requests parsed behind it wait
    in ``pipeline`` (their bodies buffered; reading pauses so at most one read's worth piles up).
    """

    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.parsing: _Exchange | None = None
        self.active: _Exchange | None = None
        self.pipeline: deque[_Exchange] = deque()
        self.closed = False
        self.reading = True
        self.write_paused = False
        self.upstream_write_paused = False
        self.idle_since = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)
        self.state.connections.add(self)
        loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        self.idle_timer = loop.call_later(self.state.keep_alive_timeout_s, self._check_idle)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(501, b"protocol upgrades are not supported by the proxy")
            return
        except httptools.HttpParserError:
            self._fail(400, b"malformed HTTP request")
            return
        active = self.active
        if active is not None:
            active.pump()
        self.update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.active is not None:
            self.active.abort()
            self.active = None
        for ex in self.pipeline:
            ex.abort()
        self.pipeline.clear()

    def pause_writing(self) -> None:
        # The client reads slower than the replica writes: stop reading the replica.
        self.write_paused = True
        up = self.active.upstream if self.active is not None else None
        if up is not None:
            up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        up = self.active.upstream if self.active is not None else None
        if up is not None:
            up.transport.resume_reading()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        ex = _Exchange(self)
        self.parsing = ex
        if self.active is None:
            self.active = ex
        else:
            self.pipeline.append(ex)

    def on_url(self, url: bytes) -> None:
        assert self.parsing is not None
        self.parsing.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        kind = classify_header(name, value)
        if kind == HeaderKind.HOP_BY_HOP:
            return
        if kind == HeaderKind.CHUNKED:
            ex.body_chunked = True
        ex.head += b"%s: %s\r\n" % (name, value)

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        ex.method = parser.get_method()
        ex.keep_alive = parser.should_keep_alive()
        ex.http10 = parser.get_http_version() == "1.0"
        # Request line + headers, as received; an HTTP/1.0 client keeps its version (so the
        # replica never answers it chunked) and asks the replica for keep-alive explicitly.
        version = b" HTTP/1.0\r\n" + _CONNECTION_KEEP_ALIVE if ex.http10 else b" HTTP/1.1\r\n"
        ex.head[:0] = b"%s %s%s" % (ex.method, ex.url, version)
        ex.head += _CRLF
        ex.head_done = True
        if ex is self.active:
            ex.start()

    def on_body(self, body: bytes) -> None:
        assert self.parsing is not None
        self.parsing.add_body(body)

    def on_message_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        self.parsing = None
        ex.end_body()
        if ex.response_done and ex is self.active:
            ex._finish()

    # -- driven by exchanges -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def writelines(self, data: list[bytes | bytearray]) -> None:
        if self.transport is not None and not self.closed:
            self.transport.writelines(data)

    def exchange_finished(self, ex: _Exchange) -> None:
        """The active exchange ``ex`` is done both ways: keep alive (next request) or close."""
        if ex is not self.active:
            return
        self.active = None
        if not ex.keep_alive:
            self.close()
            return
        if self.pipeline:
            nxt = self.active = self.pipeline.popleft()
            if nxt.head_done:
                nxt.start()  # may answer and finish it at once, starting the one after
                if self.active is nxt:
                    nxt.pump()
        else:
            self.idle_since = _now()
        self.update_reading()

    def update_reading(self) -> None:
        """Read from the client unless something downstream asks us to hold back."""
        if self.closed or self.transport is None:
            return
        active = self.active
        hold = (
            bool(self.pipeline)
            or self.upstream_write_paused
            or (active is not None and active.pending_bytes > _PENDING_HIGH_WATER)
        )
        if hold and self.reading:
            self.reading = False
            self.transport.pause_reading()
        elif not hold and not self.reading:
            self.reading = True
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()  # flushes what is buffered, then closes

    def _fail(self, status: int, message: bytes) -> None:
        self.write(local_response(status, message, close=True))
        self.close()

    def _check_idle(self) -> None:
        # Lazy idle timer: re-armed for the remaining time instead of reset on every request.
        timeout = self.state.keep_alive_timeout_s
        remaining = timeout - (_now() - self.idle_since)
        if self.active is None and self.parsing is None and remaining <= 0:
            self.idle_timer = None
            self.close()
            return
        loop = asyncio.get_running_loop()
        self.idle_timer = loop.call_later(max(remaining, 0.0) or timeout, self._check_idle)


def _now() -> float:
    return asyncio.get_running_loop().time()


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a replica; parses its responses and streams them to a client.

    Invariant: ``exchange`` is set while a request is on this connection and ``None`` while the
    connection idles in its pool; one request at a time (no upstream pipelining).
    """

    def __init__(self, pool: _UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.out: list[bytes | bytearray] = []
        self.head = bytearray()
        self.reason = b""
        self.chunked = False
        self.has_length = False
        self.until_close = False
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.reset_parser = False

    def usable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    def close(self) -> None:
        self.exchange = None
        if not self.closed:
            self.closed = True
            self.transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # nothing was asked: a confused replica; never reuse this connection
            self.pool.discard(self)
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._flush(ex)
            self._lost(ex)
            return
        # Write coalescing: one writelines for everything this read produced.
        self._flush(ex)
        if self.reset_parser:  # a HEAD response: the parser would wait for a body that never comes
            self.parser = httptools.HttpResponseParser(self)
            self.reset_parser = False
        if self.complete:
            self.complete = False
            ex.response_complete(self.keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        ex = self.exchange
        self.exchange = None
        if ex is not None:
            if self.until_close and ex.response_started:
                ex.response_complete(False)  # a body delimited by the connection closing
            else:
                self._lost(ex)

    def pause_writing(self) -> None:
        # The replica reads the request body slower than the client sends it.
        ex = self.exchange
        if ex is not None:
            ex.client.upstream_write_paused = True
            ex.client.update_reading()

    def resume_writing(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.client.upstream_write_paused = False
            ex.client.update_reading()

    def _flush(self, ex: _Exchange) -> None:
        if self.out:
            ex.client.writelines(self.out)
            self.out.clear()

    def _lost(self, ex: _Exchange) -> None:
        self.exchange = None
        if not self.closed:
            self.closed = True
            self.transport.abort()
        if ex.response_started:
            ex.upstream_lost_mid_response()
        else:
            ex.upstream_failed()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.head = bytearray()
        self.reason = b""
        self.chunked = self.has_length = self.until_close = self.interim = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        kind = classify_header(name, value)
        if kind == HeaderKind.HOP_BY_HOP:
            return
        if kind == HeaderKind.CHUNKED:
            self.chunked = True
        elif kind == HeaderKind.LENGTH:
            self.has_length = True
        self.head += b"%s: %s\r\n" % (name, value)

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        status = self.parser.get_status_code()
        head = b"HTTP/1.1 %d %s\r\n" % (status, self.reason)
        self.out.append(head)
        if 100 <= status < 200:  # interim (100 Continue): relayed, the real response follows
            self.interim = True
            self.out += (self.head, _CRLF)
            return
        ex.response_started = True
        no_body = ex.method == _HEAD or status in (204, 304)
        self.until_close = not (no_body or self.chunked or self.has_length)
        if self.until_close:
            ex.keep_alive = False  # the client learns where the body ends by the close, too
        if not ex.keep_alive:
            self.head += _CONNECTION_CLOSE
        elif ex.http10:
            self.head += _CONNECTION_KEEP_ALIVE
        self.out += (self.head, _CRLF)
        if ex.method == _HEAD:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
            self.reset_parser = True

    def on_body(self, body: bytes) -> None:
        if self.chunked:
            self.out += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.chunked:
            self.out.append(CHUNKED_END)
        self.complete = True
        # Read here: once the message is over, httptools answers False whatever the headers said.
        self.keep_alive = self.parser.should_keep_alive() and not self.until_close


class ProxyServer:
    """A running proxy: the listening socket, the shared state and the discovery feeding it."""

    def __init__(
        self,
        host: str,
        port: int,
        controller_url: str | None = None,
        *,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        source: EndpointSource | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.state = ProxyState(
            request_timeout_s=request_timeout_s, keep_alive_timeout_s=keep_alive_timeout_s
        )
        if source is None:
            if controller_url is None:
                raise ValueError("a proxy needs a controller_url or an endpoint source")
            source = Discovery(controller_url, self.state.apply)
        self.source = source
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen, then wait (briefly) for the first snapshot; ``port=0`` picks a free port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self.state), self.host, self.port, backlog=4096
        )
        self.port = self._server.sockets[0].getsockname()[1]
        await self.source.start()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.state.close()
        await self.source.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


async def serve_proxy(
    host: str,
    port: int,
    controller_url: str | None,
    *,
    request_timeout_s: float | None = None,
    keep_alive_timeout_s: float = 90,
    kubernetes_namespace: str | None = None,
    instance: str | None = None,
) -> None:
    """Run a proxy until cancelled (``main`` cancels it on SIGTERM/SIGINT).

    Endpoints come from the local controller (``controller_url``) or, in a cluster, from the
    Kubernetes API (``kubernetes_namespace``; routes of ``instance``'s applications only).
    """
    source = None
    if kubernetes_namespace is not None:
        from kubeserve.runtime.kube_discovery import KubeDiscovery

        source = KubeDiscovery(kubernetes_namespace, instance)
    server = ProxyServer(
        host,
        port,
        controller_url,
        request_timeout_s=request_timeout_s,
        keep_alive_timeout_s=keep_alive_timeout_s,
        source=source,
    )
    if source is not None:
        source.on_update = server.state.apply
    await server.start()
    log.info("kubeserve proxy listening on %s:%d", host, server.port)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    """``kubeserve proxy``: the HTTP ingress process."""
    import uvloop

    parser = argparse.ArgumentParser(prog="kubeserve proxy", description=main.__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--controller-url")
    parser.add_argument("--discovery", choices=("controller", "kubernetes"), default="controller")
    parser.add_argument("--request-timeout-s", type=float, default=None)
    parser.add_argument("--keep-alive-timeout-s", type=float, default=90.0)
    args = parser.parse_args(argv)
    if args.discovery == "controller" and not args.controller_url:
        parser.error("--controller-url is required with --discovery controller")
    in_cluster = args.discovery == "kubernetes"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve_proxy(
                args.host,
                args.port,
                args.controller_url,
                request_timeout_s=args.request_timeout_s,
                keep_alive_timeout_s=args.keep_alive_timeout_s,
                kubernetes_namespace=os.environ.get("KUBESERVE_NAMESPACE") if in_cluster else None,
                instance=os.environ.get("KUBESERVE_INSTANCE") if in_cluster else None,
            )

    uvloop.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
