"""The HTTP ingress: routes client requests to replicas and streams the answers back.

Built on ``asyncio.Protocol`` and httptools rather than a web framework, because the proxy sits on
every request: a framework server forwarding through a framework client costs two full request
objects, a task and several buffers per request. Here a request costs one :class:`_Exchange` and
the bytes it carries. The tricks, each marked where it is used:

* **Synchronous fast path**: routing, the replica choice (``Router.try_assign``) and taking a pooled
  upstream connection happen inside ``data_received``; a task exists only when a request must wait
  for a slot or a new connection.
* **Verbatim messages**: a request or response that arrives whole in one read and needs no change
  (no hop-by-hop header to drop, HTTP/1.1 keep-alive on both sides) is forwarded as the very bytes
  read, one ``write``; its head is never re-serialized. httptools still parses every byte, so what
  is forwarded is exactly the one message we parsed.
* **Bytes through** otherwise: the request line, headers and body are forwarded as the pieces
  httptools hands us; only hop-by-hop headers are dropped and chunked bodies re-framed piece by
  piece (never buffered whole).
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
import time
from collections import deque
from collections.abc import Sequence
from typing import cast

import httptools

from kubeserve.control.routes import RouteTable
from kubeserve.runtime import channel, keepalive
from kubeserve.runtime.channel import Role
from kubeserve.runtime.discovery import Discovery, EndpointSource
from kubeserve.runtime.http1 import (
    CHUNKED_END,
    HOP_OR_CHUNKED_NAME_LENGTHS,
    HeaderKind,
    chunk_prefix,
    classify_header,
    local_response,
)
from kubeserve.runtime.keepalive import IdlePool, KeepAliveConnection, pool_for
from kubeserve.runtime.router import NoReplicaAvailable, Replica, Router
from kubeserve.runtime.wire import HEALTHZ_PATH, Snapshot, deployment_key

__all__ = ["DEFAULT_ASSIGN_TIMEOUT_S", "ProxyServer", "ProxyState", "main", "serve_proxy"]

log = logging.getLogger(__name__)

#: How long a request waits for a replica slot when no request timeout is configured.
DEFAULT_ASSIGN_TIMEOUT_S = 30.0
ROUTES_PATH = "/-/routes"
_HEALTHZ_PATH = HEALTHZ_PATH.encode()
_ROUTES_PATH = ROUTES_PATH.encode()
# Paths remembered with their deployment; the memo is dropped whole when it fills up.
_ROUTE_MEMO_SIZE = 4096
# Request body bytes kept to replay the request on another replica after a connection failure.
_RETRY_BUFFER_LIMIT = 64 * 1024
# Body bytes buffered while waiting for an upstream connection before the client is paused.
_PENDING_HIGH_WATER = 256 * 1024
_CRLF = b"\r\n"
_HEAD = b"HEAD"
_CONNECTION_CLOSE = b"Connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"Connection: keep-alive\r\n"

_monotonic = time.monotonic
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
        secret: bytes,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        router: Router | None = None,
    ) -> None:
        self.secret = secret  # proves this proxy to replicas (kubeserve.runtime.channel)
        self.router = router or Router()
        self.routes = RouteTable()
        self.keys: dict[str, str] = {}  # route_prefix -> deployment key, computed once per snapshot
        self.route_memo: dict[bytes, str] = {}  # raw path -> deployment key, for this route table
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
        self.route_memo = {}
        body = json.dumps(self.routes.prefixes()).encode()
        self.routes_response = local_response(200, body, content_type=b"application/json")
        self.router.update(snapshot["deployments"])
        live = {ep["replica_id"] for d in snapshot["deployments"].values() for ep in d["replicas"]}
        for replica_id in [rid for rid in self.pools if rid not in live]:
            self.pools.pop(replica_id).close()
        self.healthy = True

    def deployment_for(self, path: bytes) -> str | None:
        """The deployment key serving ``path`` (raw bytes, no query string), or None.

        Memoized per path: a path seen before costs one dict lookup instead of a decode and a
        longest-prefix match. Misses (404s) are not remembered, so scans cannot fill the memo.
        """
        key = self.route_memo.get(path)
        if key is None:
            route = self.routes.match(path.decode("latin-1"))
            if route is None:
                return None
            key = self.keys[route["route_prefix"]]
            if len(self.route_memo) >= _ROUTE_MEMO_SIZE:
                self.route_memo.clear()
            self.route_memo[path] = key
        return key

    def pool(self, replica: Replica) -> _UpstreamPool:
        return pool_for(
            self.pools, replica.replica_id, replica.host, replica.port, self.secret, _UpstreamPool
        )

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        for conn in list(self.connections):
            conn.close()


class _UpstreamPool(IdlePool["UpstreamConnection"]):
    """Idle keep-alive connections to one replica, and new ones on demand."""

    __slots__ = ()

    async def connect(self) -> UpstreamConnection:
        return await keepalive.connect(
            lambda: UpstreamConnection(self), self.host, self.port, Role.INGRESS, self.secret
        )


class _Exchange:
    """One client request and its response, from the first request byte to the last response byte.

    Request-side fields are written by the client connection's parser callbacks; response-side
    fields by the upstream connection's. ``headers`` are the request headers to forward (hop-by-hop
    ones dropped, ``dropped`` then set); the head is serialized only when it is first written
    (:meth:`pump`), and not at all when ``raw`` holds the whole request as read. ``pending`` holds
    framed body bytes not yet written upstream; ``sent`` keeps what was written, while small, so a
    failed connection can be replayed on another replica.
    """

    # Per-request state as class-level defaults: a new exchange assigns only its client and its
    # three lists, not two dozen fields (a measurable share of the proxy's per-request CPU).
    url = b""
    dropped = False
    raw: bytes | None = None
    head_done = False
    head_sent = False
    key = ""
    method = b""
    keep_alive = True
    http10 = False
    body_chunked = False
    request_done = False
    response_started = False
    response_done = False
    pending_bytes = 0
    sent_bytes = 0
    replica: Replica | None = None
    upstream: UpstreamConnection | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    retried = False

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.headers: list[tuple[bytes, bytes]] = []
        self.pending: list[bytes] = []
        self.sent: list[bytes] | None = []

    # -- request side ----------------------------------------------------------------------------

    def add_body(self, body: bytes) -> None:
        if self.response_done:  # answered locally (error, health): the rest is read and dropped
            return
        if self.body_chunked:
            self.pending += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.pending.append(body)
        self.pending_bytes += len(body)

    def start(self) -> None:
        """Route the request (its head is complete). Called once, when it becomes the active one."""
        state = self.client.state
        url = self.url
        query = url.find(b"?")
        path = url if query < 0 else url[:query]
        if path.startswith(b"/-/"):
            if path == _HEALTHZ_PATH:
                self.respond_local(_HEALTHY if state.healthy else _UNHEALTHY)
            elif path == _ROUTES_PATH:
                self.respond_local(state.routes_response)
            else:  # replica internals are never reachable from clients
                self.respond_local(_INTERNAL_404)
            return
        key = state.route_memo.get(path) or state.deployment_for(path)
        if key is None:
            body = b"Path '%s' not found. Ping http://.../-/routes for available routes." % path
            self.respond_local(local_response(404, body))
            return
        self.key = key
        if state.request_timeout_s is not None:
            loop = self.client.loop
            assert loop is not None
            self.timer = loop.call_later(state.request_timeout_s, self._timed_out)
        # Fast path: a free slot and an idle connection need no task at all. Nothing is written
        # yet: the caller pumps once the read is parsed, so head and body leave in one write.
        replica = state.router.try_assign(key)
        if replica is not None:
            self.replica = replica
            idle = state.pool(replica).idle
            conn = idle.pop() if idle else None  # LIFO: the warmest connection
            if conn is not None and not conn.closed:  # (a closed one is dropped; the task looks on)
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
        self.pump()
        self.client.update_reading()

    def _attach(self, conn: UpstreamConnection) -> None:
        self.upstream = conn
        conn.exchange = self

    def pump(self) -> None:
        """Write what is parsed and not yet sent to the upstream connection, if one is attached.

        The first write carries the head: the request verbatim when it arrived whole and clean
        (``raw``), else the head serialized from ``headers`` followed by the body pieces so far.
        """
        up = self.upstream
        if up is None:
            return
        if not self.head_sent:
            self.head_sent = True
            raw = self.raw
            if raw is not None:  # the whole request, nothing pending: one write (and ``raw`` is
                up.transport.write(raw)  # what a retry replays: nothing to remember)
                return
            out = [self._head()]
            out += self.pending
        elif self.pending:
            out = self.pending[:]
        else:
            return
        self._remember(out)
        up.transport.writelines(out)
        self.pending.clear()
        self.pending_bytes = 0

    def _head(self) -> bytes:
        """The request line and headers as forwarded; an HTTP/1.0 client keeps its version (so the
        replica never answers it chunked) and asks the replica for keep-alive explicitly."""
        version = b" HTTP/1.0\r\n" + _CONNECTION_KEEP_ALIVE if self.http10 else b" HTTP/1.1\r\n"
        lines = [b"%s %s%s" % (self.method, self.url, version)]
        lines += [b"%s: %s\r\n" % header for header in self.headers]
        lines.append(_CRLF)
        return b"".join(lines)

    def take_raw(self, data: bytes) -> None:
        """``data`` is this whole request, exactly as read: forward it as is when nothing in it
        needs a change (saves serializing the head and framing the body again)."""
        # Keep-alive without a Connection header (nothing ``dropped``) means HTTP/1.1: 1.0 needs
        # the header to keep alive, and httptools refuses versions other than 0.9, 1.0, 1.1, 2.0
        # (and 0.9 and 2.0 are never keep-alive).
        if self.keep_alive and not (self.dropped or self.head_sent or self.response_done):
            self.raw = data
            self.pending.clear()
            self.pending_bytes = 0

    def _remember(self, pieces: Sequence[bytes]) -> None:
        if self.sent is None:
            return
        self.sent_bytes += sum(map(len, pieces))
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
            # Replay what was already sent (the head, or the raw request, is written again by
            # pump), then whatever is still pending.
            self.head_sent = False
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
        self.loop: asyncio.AbstractEventLoop | None = None
        self.parsing: _Exchange | None = None
        self.begun = 0  # requests begun in the current read
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
        # Kept, not looked up per request: on Python 3.11 get_running_loop() costs a getpid().
        loop = self.loop = asyncio.get_running_loop()
        self.idle_since = _monotonic()
        self.idle_timer = loop.call_later(self.state.keep_alive_timeout_s, self._check_idle)

    def data_received(self, data: bytes) -> None:
        fresh = self.parsing is None  # this read starts a new request (or is garbage)
        self.begun = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(501, b"protocol upgrades are not supported by the proxy")
            return
        except httptools.HttpParserError:
            self._fail(400, b"malformed HTTP request")
            return
        if fresh and self.begun == 1 and self.parsing is None:
            # Verbatim: the read held one whole request from its first byte to its last (a byte
            # more would have begun another), so ``data`` is that request as parsed.
            last = self.pipeline[-1] if self.pipeline else self.active
            if last is not None:
                last.take_raw(data)
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
        self.begun += 1
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
        # Most names cannot be special: one len() spares the call (see classify_header).
        if len(name) in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                ex.dropped = True
                return
            if kind == HeaderKind.CHUNKED:
                ex.body_chunked = True
        ex.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        ex.method = parser.get_method()
        ex.keep_alive = parser.should_keep_alive()
        # Only HTTP/1.0 needs care, and a 1.0 request is never keep-alive without a Connection
        # header (which sets ``dropped``): the common case skips building the version string.
        if ex.dropped or not ex.keep_alive:
            ex.http10 = parser.get_http_version() == "1.0"
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
        ex.request_done = True
        if ex.body_chunked and not ex.response_done:
            ex.pending.append(CHUNKED_END)
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
            self.idle_since = _monotonic()
        if not self.reading or self.upstream_write_paused:  # else nothing can have changed
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
        loop = self.loop
        assert loop is not None
        remaining = timeout - (_monotonic() - self.idle_since)
        if self.active is None and self.parsing is None and remaining <= 0:
            self.idle_timer = None
            self.close()
            return
        self.idle_timer = loop.call_later(max(remaining, 0.0) or timeout, self._check_idle)


class UpstreamConnection(KeepAliveConnection):
    """One keep-alive connection to a replica; parses its responses and streams them to a client.

    Invariant: ``exchange`` is set while a request is on this connection and ``None`` while the
    connection idles in its pool; one request at a time (no upstream pipelining). ``out`` collects
    what the current read produced for the client; a response head that may go out verbatim is
    not serialized (``head_deferred``) until the end of the read shows whether it must be.
    """

    def __init__(self, pool: _UpstreamPool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.out: list[bytes | bytearray] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.reason = b""
        self.extra = b""  # a Connection header of our own for the client
        self.dropped = False  # a hop-by-hop header of the replica's was dropped
        self.in_message = False
        self.fresh = False  # the current read started between two responses
        self.begun = 0  # responses begun in the current read
        self.head_deferred = False
        self.chunked = False
        self.until_close = False
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.reset_parser = False

    def close(self) -> None:
        self.exchange = None
        super().close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # nothing was asked: a confused replica; never reuse this connection
            self.pool.discard(self)
            self.close()
            return
        self.fresh = not self.in_message
        self.begun = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._serialize_head()
            self._flush(ex)
            self._lost(ex)
            return
        if self.head_deferred:
            if self.complete and self.begun == 1 and data.startswith(b"HTTP/1.1 "):
                # Verbatim: the read held this one response from its first byte to its last (a
                # byte more would have begun another, or failed the parse): send it as read.
                self.head_deferred = False
                self.out.clear()
                ex.client.write(data)
            else:
                self._serialize_head()
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

    def _head(self) -> bytes:
        """The status line and headers for the client: the replica's, minus hop-by-hop ones, plus
        our own Connection header when the client needs one."""
        lines = [b"HTTP/1.1 %d %s\r\n" % (self.status, self.reason)]
        lines += [b"%s: %s\r\n" % header for header in self.headers]
        lines += (self.extra, _CRLF)
        return b"".join(lines)

    def _serialize_head(self) -> None:
        """A deferred head goes out after all: in front of the body pieces of this read."""
        if self.head_deferred:
            self.head_deferred = False
            self.out.insert(0, self._head())

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
        self.begun += 1
        self.in_message = True
        self.headers = []
        self.reason = self.extra = b""
        self.chunked = self.until_close = self.interim = self.dropped = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # Most names cannot be special: one len() spares the call (see classify_header).
        # Content-Length is not looked at here; on_headers_complete asks only when it matters.
        if len(name) in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                self.dropped = True
                return
            if kind == HeaderKind.CHUNKED:
                self.chunked = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        self.status = status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue): relayed, the real response follows
            self.interim = True
            self.out.append(self._head())
            return
        ex.response_started = True
        no_body = ex.method == _HEAD or status in (204, 304)
        # A body that ends with the connection: neither chunked nor sized. httptools says "keep
        # alive" only for delimited bodies, so the common case never scans the headers.
        self.until_close = not (
            no_body or self.chunked or self.parser.should_keep_alive() or self._has_length()
        )
        if self.until_close:
            ex.keep_alive = False  # the client learns where the body ends by the close, too
        if not ex.keep_alive:
            self.extra = _CONNECTION_CLOSE
        elif ex.http10:
            self.extra = _CONNECTION_KEEP_ALIVE
        if self.fresh and self.begun == 1 and not (self.dropped or self.extra or no_body):
            self.head_deferred = True  # perhaps verbatim: data_received decides
        else:
            self.out.append(self._head())
        if ex.method == _HEAD:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
            self.reset_parser = True

    def _has_length(self) -> bool:
        return any(
            classify_header(name, value) == HeaderKind.LENGTH for name, value in self.headers
        )

    def on_body(self, body: bytes) -> None:
        if self.chunked:
            self.out += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
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
        secret: bytes,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        source: EndpointSource | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.state = ProxyState(
            secret=secret,
            request_timeout_s=request_timeout_s,
            keep_alive_timeout_s=keep_alive_timeout_s,
        )
        if source is None:
            if controller_url is None:
                raise ValueError("a proxy needs a controller_url or an endpoint source")
            source = Discovery(controller_url, self.state.apply, secret=secret)
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
    secret: bytes,
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
        secret=secret,
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
    try:
        secret = channel.take_secret()
    except ValueError as exc:
        parser.error(str(exc))

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
                secret=secret,
                request_timeout_s=args.request_timeout_s,
                keep_alive_timeout_s=args.keep_alive_timeout_s,
                kubernetes_namespace=os.environ.get("KUBESERVE_NAMESPACE") if in_cluster else None,
                instance=os.environ.get("KUBESERVE_INSTANCE") if in_cluster else None,
            )

    uvloop.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
