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
* **Lazy connection timer**: one timer per client connection that re-arms itself, instead of
  cancelling and creating a timer per request. It enforces the keep-alive timeout and the request
  head and body timeouts of :class:`~kubeserve.runtime.limits.RequestLimits`; a read that leaves a
  request incomplete notes the time (a whole request in one read never does).

Never twice: a request is sent to another replica only when it provably never reached one (the
connection or its channel handshake failed). Once a byte of it was written on a connection, a
failure answers 502 (or cuts the client's connection if the response had begun): the replica may
have run it. Pooled connections are dropped before the replica's keep-alive timeout could close
them under a request (:class:`~kubeserve.runtime.keepalive.PoolSweeper`).

Hostile input: heads, URLs and bodies are bounded by :class:`~kubeserve.runtime.limits.
RequestLimits` (408, 413, 414, 431); what is buffered per connection is bounded by them too.
Routing uses the normalised path (:func:`~kubeserve.control.routes.normalize_path`), the one the
replica's user code sees, so no spelling of a path reaches another route or the proxy's ``/-/``
endpoints; only paths holding ``%``, ``/.`` or ``//`` pay for it, and the route memo keys on the
raw path. Every response carries ``x-request-id``: the client's, or one the proxy generated and
added to the forwarded request.

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
import math
import os
import random
import signal
from collections import deque
from typing import cast

import httptools

from kubeserve.control.routes import RouteTable, needs_normalizing, normalize_path
from kubeserve.runtime import channel, keepalive
from kubeserve.runtime.channel import Role
from kubeserve.runtime.discovery import Discovery, EndpointSource
from kubeserve.runtime.http1 import (
    CHUNKED_END,
    HOP_OR_CHUNKED_NAME_LENGTHS,
    REQUEST_ID,
    HeaderKind,
    chunk_prefix,
    classify_header,
    local_response,
    new_request_id,
)
from kubeserve.runtime.keepalive import IdlePool, KeepAliveConnection, PoolSweeper, pool_for
from kubeserve.runtime.kubernetes.contract import DISCOVERY_KUBERNETES, INSTANCE_ENV, NAMESPACE_ENV
from kubeserve.runtime.limits import (
    RequestClock,
    RequestLimits,
    add_limit_arguments,
    limits_from_arguments,
)
from kubeserve.runtime.load_report import LoadReporter
from kubeserve.runtime.router import BackPressure, NoReplicaAvailable, Replica, Router
from kubeserve.runtime.wire import (
    HEALTHZ_PATH,
    UNSERVED_AT_CAPACITY,
    UNSERVED_HEADER,
    Snapshot,
    deployment_key,
)

__all__ = ["ProxyServer", "ProxyState", "main", "serve_proxy"]

log = logging.getLogger(__name__)

ROUTES_PATH = "/-/routes"
# Paths remembered with their deployment; the memo is dropped whole when it fills up.
_ROUTE_MEMO_SIZE = 4096
# Attempts to reach a replica for one request when connecting (or the handshake) fails.
_CONNECT_ATTEMPTS = 3
_UNSERVED = UNSERVED_HEADER.encode()
_AT_CAPACITY = UNSERVED_AT_CAPACITY.encode()
#: First and longest pause before a request a full replica refused is sent again.
_BUSY_FIRST_WAIT_S = 0.005
_BUSY_MAX_WAIT_S = 0.1
#: How long opening a connection to a replica (and its handshake) may take.
CONNECT_TIMEOUT_S = 10.0
# Body bytes buffered while waiting for an upstream connection before the client is paused.
_PENDING_HIGH_WATER = 256 * 1024
_CRLF = b"\r\n"
_HEAD = b"HEAD"
_CONNECTION_CLOSE = b"Connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_CONNECT = b"CONNECT"

_JSON = b"application/json"


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the proxy refuses."""


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
        limits: RequestLimits | None = None,
        router: Router | None = None,
    ) -> None:
        self.secret = secret  # proves this proxy to replicas (kubeserve.runtime.channel)
        self.limits = limits or RequestLimits()
        self.router = router or Router()
        self.routes = RouteTable()
        self.keys: dict[str, str] = {}  # route_prefix -> deployment key, computed once per snapshot
        self.route_memo: dict[bytes, str] = {}  # raw path -> deployment key, for this route table
        self.routes_body = b"{}"
        self.healthy = False
        self.request_timeout_s = request_timeout_s
        # A request waits for a replica as in Ray: until one is free, or request_timeout_s.
        self.assign_timeout_s = request_timeout_s
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.pools: dict[str, _UpstreamPool] = {}
        self.connections: set[ClientConnection] = set()
        self.sweeper = PoolSweeper(self.pools)

    def apply(self, snapshot: Snapshot) -> None:
        """Install a discovery snapshot (the ``on_update`` callback)."""
        self.routes = RouteTable(snapshot["routes"])
        self.keys = {
            r["route_prefix"]: deployment_key(r["app"], r["deployment"]) for r in self.routes.routes
        }
        self.route_memo = {}
        self.routes_body = json.dumps(self.routes.prefixes()).encode()
        self.router.update(snapshot["deployments"])
        live = {ep["replica_id"] for d in snapshot["deployments"].values() for ep in d["replicas"]}
        for replica_id in [rid for rid in self.pools if rid not in live]:
            self.pools.pop(replica_id).close()
        self.healthy = True

    def deployment_for(self, path: bytes, normalized: str) -> str | None:
        """The deployment key serving raw ``path`` (no query string), whose normal form is
        ``normalized``, or None.

        Memoized per raw path: a path seen before costs one dict lookup instead of a decode and a
        longest-prefix match. Misses (404s) are not remembered, so scans cannot fill the memo.
        Only paths that route to a deployment are remembered, never the proxy's own ``/-/``.
        """
        key = self.route_memo.get(path)
        if key is None:
            route = self.routes.match(normalized)
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
        self.sweeper.stop()
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
            lambda: UpstreamConnection(self),
            self.host,
            self.port,
            Role.INGRESS,
            self.secret,
            CONNECT_TIMEOUT_S,
        )


class _Exchange:
    """One client request and its response, from the first request byte to the last response byte.

    Request-side fields are written by the client connection's parser callbacks; response-side
    fields by the upstream connection's. ``headers`` are the request headers to forward (hop-by-hop
    ones dropped, ``dropped`` then set); the head is serialized only when it is first written
    (:meth:`pump`), and not at all when ``raw`` holds the whole request as read. ``pending`` holds
    framed body bytes not yet written upstream. ``request_id`` is the client's ``X-Request-Id`` or,
    from :meth:`start` on, one generated here (``id_line`` is then the header added upstream).
    """

    # Per-request state as class-level defaults: a new exchange assigns only its client and its
    # two lists, not two dozen fields (a measurable share of the proxy's per-request CPU).
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
    body_bytes = 0
    refusal: tuple[int, bytes] | None = None
    request_done = False
    response_started = False
    response_done = False
    pending_bytes = 0
    request_id: bytes | None = None
    id_line = b""
    replica: Replica | None = None
    upstream: UpstreamConnection | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    attempts = 1
    busy_wait = _BUSY_FIRST_WAIT_S

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.headers: list[tuple[bytes, bytes]] = []
        self.pending: list[bytes] = []

    # -- request side ----------------------------------------------------------------------------

    def add_body(self, body: bytes) -> None:
        if self.response_done:  # answered locally (error, health): the rest is read and dropped
            return
        if self.body_chunked:
            # Content-Length bodies were checked against the cap up front; chunked ones here.
            self.body_bytes += len(body)
            cap = self.client.state.limits.max_body_bytes
            if cap is not None and self.body_bytes > cap:
                message = b"request body larger than %d bytes" % cap
                if self is self.client.active:
                    self.respond_local(413, message, close=True)
                else:  # pipelined: answered in its turn, never in the middle of another answer
                    self.refusal = (413, message)
                    self.pending.clear()
                    self.response_done = True
                return
            self.pending += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.pending.append(body)
        self.pending_bytes += len(body)

    def start(self) -> None:
        """Route the request (its head is complete). Called once, when it becomes the active one."""
        if self.request_id is None:
            self.request_id = rid = new_request_id()
            self.id_line = b"x-request-id: %s\r\n" % rid
        if self.refusal is not None:
            status, message = self.refusal
            self.respond_local(status, message, close=True)
            return
        state = self.client.state
        url = self.url
        query = url.find(b"?")
        path = url if query < 0 else url[:query]
        # Fast path: a raw path seen before needs neither normalising nor matching.
        key = state.route_memo.get(path)
        if key is None:
            normalized = (
                normalize_path(path.decode("latin-1"))
                if needs_normalizing(path)
                else path.decode("latin-1")
            )
            if normalized.startswith("/-/"):
                self._internal(normalized)
                return
            key = state.deployment_for(path, normalized)
            if key is None:
                body = b"Path '%s' not found. Ping http://.../-/routes for available routes." % path
                self.respond_local(404, body)
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

    def _internal(self, path: str) -> None:
        """The proxy's own endpoints; replica internals are never reachable from clients."""
        state = self.client.state
        if path == HEALTHZ_PATH:
            if state.healthy:
                self.respond_local(200, b"success")
            else:
                self.respond_local(503, b"no snapshot from the controller yet")
        elif path == ROUTES_PATH:
            self.respond_local(200, state.routes_body, content_type=_JSON)
        else:
            self.respond_local(404, b"Not Found")

    async def _connect(self, key: str, avoid: Replica | None = None) -> None:
        state = self.client.state
        try:
            if self.replica is None:
                self.replica = await state.router.assign(key, state.assign_timeout_s, avoid)
            pool = state.pool(self.replica)
            conn = pool.take() or await pool.connect()
        except BackPressure as exc:  # max_queued_requests: backpressure_config's answer
            self.task = None
            retry_after = b"" if exc.retry_after_s is None else b"%d" % math.ceil(exc.retry_after_s)
            self.respond_local(exc.status, str(exc).encode(), retry_after=retry_after)
            return
        except NoReplicaAvailable as exc:
            self.task = None
            self.respond_local(503, str(exc).encode())
            return
        except OSError as exc:  # refused, unreachable, timed out, or failed the handshake
            self.task = None
            log.warning(
                "cannot reach replica %s of %s: %s",
                self.replica.replica_id if self.replica is not None else "?",
                key,
                exc or type(exc).__name__,
            )
            self.upstream_failed(written=False)
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
        (``raw``, with the request id header spliced in after the request line when the proxy
        made one up), else the head serialized from ``headers`` followed by the body pieces so far.
        """
        up = self.upstream
        if up is None:
            return
        if not self.head_sent:
            self.head_sent = True
            raw = self.raw
            if raw is not None:  # the whole request, nothing pending: one write
                if self.id_line:
                    line_end = raw.find(b"\n") + 1
                    up.transport.writelines((raw[:line_end], self.id_line, raw[line_end:]))
                else:
                    up.transport.write(raw)
                return
            out = [self._head()]
            out += self.pending
        elif self.pending:
            out = self.pending[:]
        else:
            return
        up.transport.writelines(out)
        self.pending.clear()
        self.pending_bytes = 0

    def _head(self) -> bytes:
        """The request line and headers as forwarded; an HTTP/1.0 client keeps its version (so the
        replica never answers it chunked) and asks the replica for keep-alive explicitly."""
        version = b" HTTP/1.0\r\n" + _CONNECTION_KEEP_ALIVE if self.http10 else b" HTTP/1.1\r\n"
        lines = [b"%s %s%s" % (self.method, self.url, version)]
        lines += [b"%s: %s\r\n" % header for header in self.headers]
        lines += (self.id_line, _CRLF)
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

    # -- response side ---------------------------------------------------------------------------

    def retry_unserved(self, at_capacity: bool = False) -> None:
        """The replica answered that it never started the request: it is shutting down (send it
        to another replica, the whole request being held in ``raw``, or answer 503), or it runs
        ``max_ongoing_requests`` for all its callers (wait a moment and ask the router again,
        not counted as an attempt)."""
        failed = self._drop_replica()
        if self.client.closed:
            return
        self.head_sent = False
        if at_capacity:
            self.task = asyncio.create_task(self._connect_when_free(failed))
            return
        if not self._try_another(failed):
            self.respond_local(503, b"no replica took the request: they are shutting down")

    def _drop_replica(self) -> Replica | None:
        """Let go of the upstream connection and the replica's slot; returns that replica."""
        failed = self.replica
        self.upstream = None
        if failed is not None:
            self.client.state.router.release(failed)
            self.replica = None
        return failed

    def _try_another(self, failed: Replica | None) -> bool:
        """Send the request to a replica other than ``failed``, within
        :data:`_CONNECT_ATTEMPTS` in all; False when they are used up."""
        if self.attempts >= _CONNECT_ATTEMPTS:
            return False
        self.attempts += 1
        self.task = asyncio.create_task(self._connect(self.key, avoid=failed))
        return True

    async def _connect_when_free(self, full: Replica | None) -> None:
        await asyncio.sleep(self.busy_wait * (0.5 + random.random()))
        self.busy_wait = min(self.busy_wait * 2, _BUSY_MAX_WAIT_S)
        await self._connect(self.key, avoid=full)

    def upstream_failed(self, *, written: bool) -> None:
        """The upstream connection failed before any response byte.

        Tried again on another replica only when nothing of the request was ``written`` (the
        connection or its handshake failed), at most :data:`_CONNECT_ATTEMPTS` times in all;
        otherwise 502: the replica may have run the request, and running it twice is worse than
        an error the client can see.
        """
        failed = self._drop_replica()
        if self.client.closed:
            return
        if not (written or self.head_sent) and self._try_another(failed):
            return
        if written:
            message = b"the replica closed the connection before answering"
        else:
            message = b"no replica could be reached"
        self.respond_local(502, message, close=True)

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

    def respond_local(
        self,
        status: int,
        body: bytes,
        *,
        close: bool = False,
        content_type: bytes = b"text/plain; charset=utf-8",
        retry_after: bytes = b"",
    ) -> None:
        """Answer without a replica (health, routes, 404, 408, 413, 502, 503, 504...).

        With ``close`` the connection ends after the answer, even if the request body is still
        arriving; otherwise the rest of the body is read and dropped, and keep-alive goes on.
        """
        self.response_started = self.response_done = True
        self.pending.clear()
        self.pending_bytes = 0
        self.client.write(
            local_response(
                status,
                body,
                content_type=content_type,
                close=close,
                request_id=self.request_id,
                retry_after=retry_after,
            )
        )
        if self.replica is not None:
            self.client.state.router.release(self.replica)
            self.replica = None
        if self.upstream is not None:
            self.upstream.exchange = None
            self.upstream.close()
            self.upstream = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
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
                self.respond_local(503, b"no replica available in time")
            else:
                self.respond_local(504, b"request timed out", close=True)

    def client_too_slow(self, what: str) -> None:
        """The client stalled sending this request (its head or body): 408 and close, which
        releases the replica slot and drops the upstream connection, so the replica never runs
        a request it did not receive whole."""
        if self.response_started:
            self.abort()
            self.client.close()
        else:
            self.respond_local(408, b"request %s not received in time" % what.encode(), close=True)

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
    ``clock`` (:class:`~kubeserve.runtime.limits.RequestClock`) holds the deadlines of the request
    being received and the one timer of the connection (:meth:`_tick`).
    """

    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.limits = state.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.parsing: _Exchange | None = None
        self.begun = 0  # requests begun in the current read
        self.read_size = 0  # bytes in the current read
        self.active: _Exchange | None = None
        self.pipeline: deque[_Exchange] = deque()
        self.closed = False
        self.reading = True
        self.write_paused = False
        self.upstream_write_paused = False
        self.upgrade_refused = False
        self.idle_since = 0.0
        self.clock: RequestClock = None  # type: ignore[assignment]  # set on connect

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)
        self.state.connections.add(self)
        # Kept, not looked up per request: on Python 3.11 get_running_loop() costs a getpid().
        loop = self.loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        self.clock = RequestClock(self.limits, loop, self._tick)
        self.clock.arm(self.state.keep_alive_timeout_s)

    def data_received(self, data: bytes) -> None:
        fresh = self.parsing is None  # this read starts a new request (or is garbage)
        self.begun = 0
        self.read_size = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Answered (501) by the exchange in its turn; what follows would be a tunnel.
            self.upgrade_refused = True
            if self.transport is not None:
                self.transport.pause_reading()
            return
        except httptools.HttpParserError as exc:
            if self.upgrade_refused:
                return
            if isinstance(exc.__context__, _Refused):
                status, message = exc.__context__.args
                self._fail(status, message)
            else:
                self._fail(400, b"malformed HTTP request")
            return
        parsing = self.parsing
        if parsing is not None:  # the read ended inside a request: note it for the timeouts
            if not self.clock.partial(parsing.head_done, self.read_size):
                limit = self.limits.max_header_bytes
                self._fail(431, b"request head larger than %d bytes" % limit)
                return
        elif fresh and self.begun == 1:
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
        if self.clock is not None:
            self.clock.cancel()
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
        ex = self.parsing
        assert ex is not None
        ex.url += url
        if len(ex.url) > self.limits.max_url_bytes:
            raise _Refused(414, b"request target longer than %d bytes" % self.limits.max_url_bytes)

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        # Most names cannot be special: one len() spares the call (see classify_header), and
        # a first letter spares lower-casing Content-Type to compare it with X-Request-Id.
        size = len(name)
        if size in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                ex.dropped = True
                return
            if kind == HeaderKind.CHUNKED:
                ex.body_chunked = True
        elif size == 14:
            if name.lower() == b"content-length":
                self._check_length(ex, value)
        elif size == 12 and name[0] | 0x20 == 0x78 and name.lower() == REQUEST_ID and value:
            ex.request_id = ex.request_id or value
        ex.headers.append((name, value))

    def _check_length(self, ex: _Exchange, value: bytes) -> None:
        """A declared body over the cap is refused before a byte of it is read."""
        cap = self.limits.max_body_bytes
        if cap is not None and value.strip().isdigit() and int(value) > cap:
            ex.refusal = (413, b"request body larger than %d bytes" % cap)

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
        # Upgrade and CONNECT: httptools stops parsing after this request (what follows would be
        # another protocol); the exchange answers 501 in its turn, the only answer it gets.
        if (ex.dropped or ex.method == _CONNECT) and parser.should_upgrade():
            ex.refusal = (501, b"%s is not supported by the proxy" % _upgrade_name(ex))
        ex.head_done = True
        limit = self.limits.max_header_bytes
        if self.clock.head_may_be_too_large(self.read_size) and _head_size(ex) > limit:
            ex.refusal = (431, b"request head larger than %d bytes" % limit)
        if ex.refusal is not None:
            ex.response_done = True  # a body that follows is read and dropped
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
            self.idle_since = self.loop.time() if self.loop is not None else 0.0
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
        """Answer a request that cannot be parsed or kept, then close."""
        ex = self.parsing
        rid = ex.request_id if ex is not None and ex.request_id else new_request_id()
        self.write(local_response(status, message, close=True, request_id=rid))
        self.close()

    def _tick(self) -> None:
        """The connection timer: keep-alive timeout when idle, head and body timeouts while a
        request is arriving; re-arms itself for the nearest deadline."""
        clock = self.clock
        clock.fired()
        if self.closed or self.loop is None:
            return
        now = self.loop.time()
        parsing = self.parsing
        if parsing is not None:
            remaining, late = clock.overdue(parsing.head_done, self.reading, now)
            if remaining <= 0:
                if parsing is self.active:
                    parsing.client_too_slow(late)
                else:
                    self.close()
                return
        elif self.active is None:
            remaining = self.idle_since + self.state.keep_alive_timeout_s - now
            if remaining <= 0:
                self.close()
                return
        else:  # a response in progress: the request timeout, if any, is the exchange's own timer
            remaining = self.state.keep_alive_timeout_s
        clock.arm(max(remaining, 0.001), now)


def _head_size(ex: _Exchange) -> int:
    """Roughly the bytes of ``ex``'s request head (line and headers as parsed)."""
    return len(ex.method) + len(ex.url) + sum(len(n) + len(v) + 4 for n, v in ex.headers) + 12


def _upgrade_name(ex: _Exchange) -> bytes:
    if ex.method == _CONNECT:
        return b"CONNECT (tunnelling)"
    for name, value in ex.headers:
        if name.lower() == b"upgrade":
            return b"upgrading to " + value[:64]
    return b"a protocol upgrade"


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
        self.has_id = False  # the response carries X-Request-Id
        self.unserved = False  # a 503 saying the replica never started the request
        self.at_capacity = False  # ... because it runs max_ongoing_requests already
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
        if self.unserved:  # not for the client: the request goes to another replica
            if self.complete:
                self.unserved = self.complete = False
                self.out.clear()
                self.exchange = None
                self.pool.discard(self)
                self.close()
                ex.retry_unserved(self.at_capacity)
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
            ex.upstream_failed(written=True)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
        self.in_message = True
        self.headers = []
        self.reason = self.extra = b""
        self.chunked = self.until_close = self.interim = self.dropped = self.has_id = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # Most names cannot be special: one len() spares the call (see classify_header).
        # Content-Length is not looked at here; on_headers_complete asks only when it matters.
        size = len(name)
        if size in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                self.dropped = True
                return
            if kind == HeaderKind.CHUNKED:
                self.chunked = True
        elif size == 12 and name[0] | 0x20 == 0x78 and name.lower() == REQUEST_ID:
            self.has_id = True  # (0x78: "x"; Content-Type is the usual other 12-letter name)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        self.status = status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue): relayed, the real response follows
            self.interim = True
            self.out.append(self._head())
            return
        if status == 503 and ex.raw is not None and ex.request_done and self._unserved():
            self.unserved = True  # held whole and never started: data_received re-sends it
            self.at_capacity = self._unserved_reason() == _AT_CAPACITY
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
        if not self.has_id and ex.request_id:  # kubeserve replicas echo it; others may not
            self.extra += b"x-request-id: %s\r\n" % ex.request_id
        if self.fresh and self.begun == 1 and not (self.dropped or self.extra or no_body):
            self.head_deferred = True  # perhaps verbatim: data_received decides
        else:
            self.out.append(self._head())
        if ex.method == _HEAD:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
            self.reset_parser = True

    def _unserved(self) -> bool:
        return any(name.lower() == _UNSERVED for name, _ in self.headers)

    def _unserved_reason(self) -> bytes:
        return next((value for name, value in self.headers if name.lower() == _UNSERVED), b"")

    def _has_length(self) -> bool:
        return any(
            classify_header(name, value) == HeaderKind.LENGTH for name, value in self.headers
        )

    def on_body(self, body: bytes) -> None:
        if self.unserved:
            return
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
        limits: RequestLimits | None = None,
        source: EndpointSource | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.state = ProxyState(
            secret=secret,
            request_timeout_s=request_timeout_s,
            keep_alive_timeout_s=keep_alive_timeout_s,
            limits=limits,
        )
        if source is None:
            if controller_url is None:
                raise ValueError("a proxy needs a controller_url or an endpoint source")
            source = Discovery(controller_url, self.state.apply, secret=secret)
        self.source = source
        #: tells the controller what waits here (local backend: its Discovery is the source)
        self.load_reporter = (
            None
            if controller_url is None
            else LoadReporter(controller_url, self.state.router, secret=secret)
        )
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen, then wait (briefly) for the first snapshot; ``port=0`` picks a free port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self.state), self.host, self.port, backlog=4096
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.state.sweeper.start()
        if self.load_reporter is not None:
            self.load_reporter.start()
        await self.source.start()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.state.close()
        if self.load_reporter is not None:
            await self.load_reporter.close()
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
    limits: RequestLimits | None = None,
    kubernetes_namespace: str | None = None,
    instance: str | None = None,
) -> None:
    """Run a proxy until cancelled (``main`` cancels it on SIGTERM/SIGINT).

    Endpoints come from the local controller (``controller_url``) or, in a cluster, from the
    Kubernetes API (``kubernetes_namespace``; routes of ``instance``'s applications only).
    """
    source = None
    if kubernetes_namespace is not None:
        from kubeserve.runtime.kubernetes.discovery import KubeDiscovery

        source = KubeDiscovery(kubernetes_namespace, instance)
    server = ProxyServer(
        host,
        port,
        controller_url,
        secret=secret,
        request_timeout_s=request_timeout_s,
        keep_alive_timeout_s=keep_alive_timeout_s,
        limits=limits,
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
    parser.add_argument(
        "--discovery", choices=("controller", DISCOVERY_KUBERNETES), default="controller"
    )
    parser.add_argument("--request-timeout-s", type=float, default=None)
    parser.add_argument("--keep-alive-timeout-s", type=float, default=90.0)
    add_limit_arguments(parser)
    args = parser.parse_args(argv)
    if args.discovery == "controller" and not args.controller_url:
        parser.error("--controller-url is required with --discovery controller")
    in_cluster = args.discovery == DISCOVERY_KUBERNETES
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        secret = channel.take_secret()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        limits = limits_from_arguments(args)
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
                limits=limits,
                kubernetes_namespace=os.environ.get(NAMESPACE_ENV) if in_cluster else None,
                instance=os.environ.get(INSTANCE_ENV) if in_cluster else None,
            )

    uvloop.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
