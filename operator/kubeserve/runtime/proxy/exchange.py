"""One request through the proxy: routing, the replica choice, forwarding, the answer.

:class:`Exchange` is the per-request state machine between the client connection that parsed the
request (:mod:`~kubeserve.runtime.proxy.client`) and the upstream connection carrying it to a
replica (:mod:`~kubeserve.runtime.proxy.upstream`).

Never twice: a request is sent to another replica only when it provably never reached one (the
connection or its channel handshake failed, or the replica answered it unserved). Once a byte of it
was written on a connection, a failure answers 502 (or cuts the client's connection if the response
had begun): the replica may have run it.

Ownership: an exchange owns its router slot (released exactly once, in :meth:`Exchange._finish`,
:meth:`Exchange.respond_local` or :meth:`Exchange.abort`, or handed to the
:class:`~kubeserve.runtime.proxy.tunnel.Tunnel` of a WebSocket the replica accepted) and its
upstream connection until it hands it back to the pool.

A WebSocket handshake (``upgrade``) is routed and forwarded as any request, on a new connection to
the replica (:mod:`~kubeserve.runtime.proxy.tunnel`); it may be sent again while the replica
answers it unserved, as its whole request is its head.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from time import perf_counter
from typing import TYPE_CHECKING

from kubeserve.control.routes import needs_normalizing, normalize_path
from kubeserve.runtime import tracing
from kubeserve.runtime.http1 import chunk_prefix, local_response, new_request_id
from kubeserve.runtime.http_connection import body_too_large
from kubeserve.runtime.metrics import METHOD_LABELS, OTHER_METHOD
from kubeserve.runtime.router import (
    BackPressure,
    DeploymentUnavailable,
    NoReplicaAvailable,
    RoutedReplica,
)
from kubeserve.runtime.wire import HEALTHZ_PATH

if TYPE_CHECKING:
    from kubeserve.runtime.proxy.client import ClientConnection
    from kubeserve.runtime.proxy.tunnel import ClientEnd
    from kubeserve.runtime.proxy.upstream import UpstreamConnection
    from kubeserve.runtime.tracer import Tracer

__all__ = ["BUFFER_BEFORE_SLOT", "ROUTES_PATH", "Exchange"]

log = logging.getLogger(__name__)

ROUTES_PATH = "/-/routes"
#: Request body bytes the proxy holds before it asks the router for a replica slot: a body that
#: ends within them is received whole first, so a client that stalls mid-upload holds no slot
#: (it is answered 408 at ``body_timeout_s``, and no replica ever sees it); a larger body takes
#: its slot once this much arrived and streams from then on. As large as what a request waiting
#: for its upstream connection buffered already (reading pauses beyond it), so the proxy holds no
#: more per connection than before.
BUFFER_BEFORE_SLOT = 256 * 1024
# Attempts to reach a replica for one request when connecting (or the handshake) fails.
_CONNECT_ATTEMPTS = 3
#: First and longest pause before a request a full replica refused is sent again.
_BUSY_FIRST_WAIT_S = 0.005
_BUSY_MAX_WAIT_S = 0.1
_CRLF = b"\r\n"
_CONNECTION_KEEP_ALIVE = b"Connection: keep-alive\r\n"
#: The hop-by-hop headers of a WebSocket handshake, dropped with the others and forwarded again.
_WEBSOCKET_HOP = [(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")]
#: The method a WebSocket is recorded with (metrics, access log), as Ray's proxy records it.
_WEBSOCKET_METHOD = b"WEBSOCKET"
_JSON = b"application/json"
#: The answer to a request that comes before the proxy's first routes (a late controller).
_NO_ROUTES_YET = b"this proxy has not received its routes yet; retry shortly"
#: The status recorded for a request whose client left before its answer (as Ray records it).
_CLIENT_LEFT = 499


class Exchange:
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
    #: the multiplexed model the request names (``serve_multiplexed_model_id``), "" for none
    model_id = ""
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
    replica: RoutedReplica | None = None
    upstream: UpstreamConnection | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    attempts = 1
    #: when the request was routed (``perf_counter``); 0 once its answer was recorded
    started = 0.0
    #: the ``route`` label of a request for one of the proxy's own endpoints (its path; ""
    #: for any other ``/-/`` path, as for every path no route matches)
    own_route = ""
    busy_wait = _BUSY_FIRST_WAIT_S
    #: the request's ``Upgrade`` header (dropped from ``headers`` as hop-by-hop)
    upgrade_to = b""
    #: a WebSocket handshake, and the client connection's end once the parser stopped at it
    upgrade = False
    client_end: ClientEnd | None = None
    #: routed, its body still arriving (at most BUFFER_BEFORE_SLOT of it), no slot asked for yet
    unassigned = False
    #: the client sent ``Expect: 100-continue``: it waits for the replica's 100 before its body
    expects_continue = False
    #: the request's span when the proxy traces (``tracing_config``), ended with its answer
    span: object = None

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
                message = body_too_large(cap)
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
        if self.unassigned and self.pending_bytes > BUFFER_BEFORE_SLOT:
            self.assign()  # a large body: it streams from here on, on a slot of its own

    def websocket(self) -> None:
        """This request is a WebSocket handshake: forwarded with its upgrade headers, and the
        client connection ends with it (its parser stops at the upgrade). Its head is its whole
        request: serialized when it is routed (:meth:`start`), as ``raw`` (which :meth:`pump`
        writes, and which may be sent again to another replica while replicas answer it
        unserved)."""
        self.upgrade = True
        self.keep_alive = False
        self.headers += _WEBSOCKET_HOP
        self.method = _WEBSOCKET_METHOD  # from now on only its label

    def start(self) -> None:
        """Route the request (its head is complete). Called once, when it becomes the active one."""
        if self.request_id is None:
            self.request_id = rid = new_request_id()
            self.id_line = b"x-request-id: %s\r\n" % rid
        self.started = perf_counter()
        state = self.client.state
        state.metrics.in_flight += 1
        if self.refusal is not None:
            status, message = self.refusal
            self.respond_local(status, message, close=True)
            return
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
            if key is None and not state.healthy:  # no routes yet: this one may come
                self.respond_local(503, _NO_ROUTES_YET, retry_after=b"1")
                return
            if key is None:
                body = b"Path '%s' not found. Ping http://.../-/routes for available routes." % path
                self.respond_local(404, body)
                return
        self.key = key
        if tracing.ACTIVE is not None:
            self._trace(tracing.ACTIVE)
        if state.request_timeout_s is not None:
            loop = self.client.loop
            assert loop is not None
            self.timer = loop.call_later(state.request_timeout_s, self._timed_out)
        if self.upgrade:  # a WebSocket: a connection of its own, through the task
            self.raw = b"GET %s HTTP/1.1\r\n%s\r\n" % (
                self.url,
                b"".join(b"%s: %s\r\n" % header for header in self.headers),
            )
            self.task = asyncio.create_task(self._connect(key))
            return
        if self.request_done or self.expects_continue or self.pending_bytes > BUFFER_BEFORE_SLOT:
            self.assign()
        else:  # the body first (on_message_complete, or add_body past the bound), then a slot
            self.unassigned = True

    def _trace(self, tracer: Tracer) -> None:
        """Start this request's span; upstream, its trace-context headers replace the client's
        (see :meth:`Tracer.proxy_request`). A WebSocket's span lasts as long as the socket."""
        labels = self.client.state.labels.get(self.key) or ("", "", "")
        self.span, kept, lines = tracer.proxy_request(
            self.headers, self.request_id, self.method, labels, self.upgrade
        )
        self.dropped = True  # from now on the head is serialized, never forwarded verbatim
        self.id_line += lines
        if kept is None:
            return
        self.headers = kept
        raw = self.raw
        end = -1 if raw is None else raw.find(b"\r\n\r\n")
        if raw is not None and end >= 0:  # read whole already (pipelined): the body stays
            body = raw[end + 4 :]
            self.raw = None
            self.pending = [body] if body else []
            self.pending_bytes = len(body)

    def assign(self) -> None:
        """Ask the router for a replica slot and an upstream connection: at once when the
        request is complete (a request whole in one read gets here within the same read), else
        when it passed :data:`BUFFER_BEFORE_SLOT` or its client waits for a 100 Continue."""
        self.unassigned = False
        state = self.client.state
        key = self.key
        # Fast path: a free slot and an idle connection need no task at all. Nothing is written
        # yet: the caller pumps once the read is parsed, so head and body leave in one write.
        replica = state.router.try_assign(key, None, self.model_id)
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
            self.own_route = HEALTHZ_PATH
            if state.healthy:
                self.respond_local(200, b"success")
            else:
                self.respond_local(503, b"no snapshot from the controller yet")
        elif path == ROUTES_PATH:
            self.own_route = ROUTES_PATH
            self.respond_local(200, state.routes_body, content_type=_JSON)
        else:
            self.respond_local(404, b"Not Found")

    async def _connect(self, key: str, avoid: RoutedReplica | None = None) -> None:
        state = self.client.state
        try:
            if self.replica is None:
                self.replica = await state.router.assign(
                    key, state.assign_timeout_s, avoid, self.model_id
                )
            pool = state.pool(self.replica)
            conn = (None if self.upgrade else pool.take()) or await pool.connect()
        except (BackPressure, DeploymentUnavailable) as exc:
            # max_queued_requests (backpressure_config's answer), or no replica is coming
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
        made one up), else the head serialized from ``headers`` followed by the body pieces so far
        (kept as ``raw`` when that is the whole request).
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
            if self.request_done and self.pending_bytes <= BUFFER_BEFORE_SLOT:
                # Whole, serialized (a dropped header, HTTP/1.0): held as ``raw``, request id
                # included, so that a replica answering it unserved (full, with a native data
                # path or a handle that filled it first) gets it sent again, as a verbatim one.
                self.raw, self.id_line = b"".join(out), b""
                up.transport.write(self.raw)
                self.pending.clear()
                self.pending_bytes = 0
                return
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

    def _drop_replica(self) -> RoutedReplica | None:
        """Let go of the upstream connection and the replica's slot; returns that replica."""
        failed = self.replica
        self.upstream = None
        if failed is not None:
            self.client.state.router.release(failed)
            self.replica = None
        return failed

    def _try_another(self, failed: RoutedReplica | None) -> bool:
        """Send the request to a replica other than ``failed``, within
        :data:`_CONNECT_ATTEMPTS` in all; False when they are used up. A replica on its way out
        (it refused the connection or shuts down) leaves the router's choice and costs no
        attempt: the request goes to another one, or waits for one (see :meth:`Router.retire`)."""
        if failed is not None and self.client.state.router.retire(failed):
            pass
        elif self.attempts >= _CONNECT_ATTEMPTS:
            return False
        else:
            self.attempts += 1
        self.task = asyncio.create_task(self._connect(self.key, avoid=failed))
        return True

    async def _connect_when_free(self, full: RoutedReplica | None) -> None:
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

    def upgrade_accepted(self, conn: UpstreamConnection, from_replica: bytes) -> None:
        """The replica answered this WebSocket handshake 101 (relayed already): splice the
        client and ``conn`` (what the replica sent behind its 101 is ``from_replica``). The
        tunnel takes the replica slot over; the request timeout no longer applies."""
        from kubeserve.runtime.proxy.tunnel import Tunnel

        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        conn.exchange = None
        self.upstream = None
        self.response_done = True
        replica, self.replica = self.replica, None
        client = self.client
        client.active = None
        client.clock.cancel()  # no keep-alive or request timeouts on a socket
        end = self.client_end
        assert end is not None  # made when the client's parser stopped, before routing
        Tunnel(self, replica, end, conn.transport, from_replica)

    def tunnel_ended(self, status: int) -> None:
        """The WebSocket closed: its metrics and access line, once."""
        self._record(status)

    def response_complete(self, reusable: bool) -> None:
        conn = self.upstream
        self.response_done = True
        if conn is not None:
            self._record(conn.status)
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
        self._record(status)
        self.pending.clear()
        self.pending_bytes = 0
        self.client.write(
            local_response(
                status,
                body,
                content_type=content_type,
                close=close or not self.keep_alive,
                request_id=self.request_id,
                retry_after=retry_after,
            )
        )
        self._let_go()
        if close:
            self.keep_alive = False
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.client.close_lingering()  # the client may still be sending this request
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
            if self.unassigned:  # its body never arrived whole: the client is late, not a replica
                self.respond_local(408, b"request body not received in time", close=True)
            elif self.replica is None:  # still queued for a slot: that is unavailability, 503
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
        self._record(_CLIENT_LEFT)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._let_go()
        self.response_done = True

    def _record(self, status: int) -> None:
        """The request's metrics, once: its answer's status, or 499 if the client left first."""
        started = self.started
        if not started:
            return
        self.started = 0.0
        state = self.client.state
        metrics = state.metrics
        metrics.in_flight -= 1
        route, application, deployment = state.labels.get(self.key) or (self.own_route, "", "")
        latency_ms = (perf_counter() - started) * 1000.0
        metrics.record(
            METHOD_LABELS.get(self.method, OTHER_METHOD),
            route,
            application,
            deployment,
            status,
            latency_ms,
        )
        if state.access_log is not None and not self.own_route:  # probes are not traffic
            method = self.method.decode("latin-1")
            shown = route or self.url.partition(b"?")[0].decode("latin-1")
            state.access_log.add(method, shown, status, latency_ms, self.request_id)
        if self.span is not None and tracing.ACTIVE is not None:
            tracing.ACTIVE.end(self.span, status)

    def _let_go(self) -> None:
        """Stop waiting for a replica, drop the upstream connection (it may hold a half-written
        request or an unread response: never reused) and give back the replica's slot."""
        if self.unassigned:
            self.unassigned = False
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
