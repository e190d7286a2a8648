"""The replica's HTTP/1.1 server: ``asyncio.Protocol`` + httptools, one request at a time per
connection (pipelined requests wait their turn, in order).

Why not a web framework: every user request and handle call crosses this server, and a framework
server builds a request object with header multidicts, a payload stream and a response object per
request, costing more CPU than the no-op user code it serves. Here a request is one
:class:`HttpRequest` (plain strings and bytes) and a response is written with one ``writelines``.
The tricks, each marked where it is used:

* **Handler run eagerly**: the handler coroutine is stepped inside ``data_received``; a task is
  created only when it actually waits on the loop. A sync user method never needs one: its
  worker thread's result steps the coroutine on from the callback that delivers it
  (:meth:`~kubeserve.runtime.thread_hop.ThreadHop.then`).
* **A sync handler's answer written by its worker thread**: on user traffic behind the sealed
  channel, a plain ``__call__`` returning a ``str`` (Ray's default convention, its commonest
  answer) is answered from the worker thread that ran it, right after the call
  (:meth:`_Connection.answer_from_worker`, the server's ``plain`` hook per role); the loop
  then counts the request done and serves the connection's next one. Under load a worker runs
  a batch of calls while the loop waits for the GIL: their answers now leave one by one as the
  calls return, and the proxy and its clients work on them meanwhile, instead of all after the
  batch once the loop was woken (measured: sync no-op through the proxy from 73-74% of the
  async one's req/s to 85-95%, ``benchmarks/README.md``).
* **Write coalescing**: status line, headers and body go out in one ``writelines`` (one syscall).
* **Cached Date header**, re-formatted once per second instead of per response.
* **Compiled parse and answer** where ``kubeserve._native`` is built
  (:mod:`~kubeserve.runtime.native_module`): a whole common request is parsed in one call
  (:meth:`_Connection._parse_whole`; anything else, limits and errors included, goes through
  httptools' callbacks) and a complete answer is formatted in one. Behind the authenticated
  channel the connection takes the sealed frames itself (:meth:`_Connection.opens_frames`):
  one call opens a read's frames and makes the whole requests in them (request ids included),
  and one formats a complete answer and seals it.
* **Lazy connection timer**: one timer per connection that re-arms itself, instead of a timer
  per request; it enforces the keep-alive timeout and the head and body timeouts of
  :class:`~kubeserve.runtime.limits.RequestLimits`, measured from the reads that left a request
  incomplete (a whole request in one read never looks at the clock).

Hostile input: the same :class:`~kubeserve.runtime.limits.RequestLimits` as the proxy (408, 413,
414, 431), so a replica never buffers more of a request than a proxy would let through, whoever
connects. The path user code sees is :func:`~kubeserve.control.routes.normalize_path`'s, the one
the proxy routed on. Every response to user traffic carries ``x-request-id`` (the caller's, or a
new one), and an exception escaping the handler answers a 500 naming only that id.

The connection's life, flow control, limits and timer are those of the proxy's client connections:
both build on :class:`~kubeserve.runtime.http_connection.ServerConnection`.

A WebSocket handshake on user traffic is the connection's last request: when httptools stops at
its upgrade, the transport is handed to a :class:`~kubeserve.runtime.websocket.WebSocketSession`
and the server's ``websocket`` handler serves it for as long as the socket lives (no keep-alive or
request timeouts on it). Other upgrades (h2c...) and CONNECT are answered 501.

The server knows nothing about deployments: it is given a handler ``HttpRequest -> HttpResponse |
StreamedResponse`` per channel role (:class:`~kubeserve.runtime.replica.ingress.Ingress` and
:class:`~kubeserve.runtime.replica.control.Control`). With a secret, every
connection must pass the :mod:`~kubeserve.runtime.channel` handshake before a byte of it is parsed,
and its role picks its handler for good: user traffic (``INGRESS``) or internal endpoints
(``CONTROL``). Invariants: a connection runs at most one handler at a time; a response with
``close=True`` ends its connection once written; a request on user traffic or a handle call
(``/-/call/``) whose connection is lost while its handler waits in a task is cancelled (its caller
left: an HTTP client that disconnected, a gRPC client's cancel, a cancelled handle call).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from kubeserve.control.routes import needs_normalizing, normalize_path
from kubeserve.runtime.channel import Role, ServerChannel, peer_description
from kubeserve.runtime.http1 import REASONS, REQUEST_ID, http_date, is_websocket, new_request_id
from kubeserve.runtime.http_connection import (
    RequestRefused,
    ServerConnection,
    body_too_large,
    head_too_large,
)
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.native_module import NATIVE
from kubeserve.runtime.replica.inflow import Inflow
from kubeserve.runtime.sealing import FrameError, frame_failed
from kubeserve.runtime.thread_hop import current_hop
from kubeserve.runtime.websocket import (
    GOING_AWAY,
    PING_INTERVAL_S,
    SessionState,
    WebSocketSession,
)
from kubeserve.runtime.wire import CALL_PREFIX, DUPLEX_PREFIX
from kubeserve.sdk.multiplex import MODEL_ID_HEADER

__all__ = [
    "HttpRequest",
    "HttpResponse",
    "ReplicaHttpServer",
    "StreamedResponse",
    "WebSocketHandler",
    "internal_error",
    "text_response",
    "typed_response",
]

log = logging.getLogger(__name__)

#: ``kubeserve._native.parse_request`` (see :meth:`_Connection._parse_whole`), or None: every
#: request through httptools' callbacks
#: (an extension built before its ``Tally``, whose parse gave no model id: not used)
_parse_request = NATIVE.parse_request if NATIVE is not None and hasattr(NATIVE, "Tally") else None
#: ``kubeserve._native.answer`` (see :meth:`_Connection._write_head`), or None
_answer = NATIVE.answer if NATIVE is not None else None
#: ``kubeserve._native.send_now`` (see :meth:`_Connection.answer_from_worker`), or None
_send_now = getattr(NATIVE, "send_now", None)

#: Requests parsed ahead of the one being served before the connection stops reading.
_PIPELINE_LIMIT = 16
_CRLF = b"\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CHUNKED_END = b"0\r\n\r\n"
_DUPLEX = DUPLEX_PREFIX.encode()
_MODEL_ID = MODEL_ID_HEADER.encode()
_REASONS = REASONS
#: Encoded header lines of responses, by (name, value): most responses repeat a few headers
#: (the content type above all), formatted once each; at most this many are kept, short ones.
_HEADER_LINES: dict[tuple[str, str], bytes] = {}
_HEADER_LINES_KEPT = 512


class HttpRequest:
    """One request with its whole body; ``path`` normalised (percent-decoded, dot segments
    resolved), ``headers`` as sent, in order; ``request_id`` the caller's ``X-Request-Id`` or, on
    user traffic without one, a new one ("" on internal endpoints); ``model_id`` the first
    ``serve_multiplexed_model_id`` header's value ("" for none)."""

    __slots__ = (
        "body",
        "headers",
        "http10",
        "inflow",
        "keep_alive",
        "method",
        "model_id",
        "path",
        "query_string",
        "request_id",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: list[tuple[str, str]],
        body: bytes,
        keep_alive: bool,
        http10: bool,
        request_id: str = "",
        model_id: str = "",
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10
        self.request_id = request_id
        self.model_id = model_id
        #: a duplex call's body, arriving (``body`` is empty then): see :meth:`_Connection.duplex`
        self.inflow: Inflow | None = None


class HttpResponse:
    """A complete response; ``Content-Length`` (and ``Date``) are added by the server."""

    __slots__ = ("body", "close", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        *,
        content_type: str | None = "text/plain; charset=utf-8",
        close: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers) if headers else {}
        if content_type is not None and "content-type" not in self.headers:
            self.headers["content-type"] = content_type
        self.close = close


_new = object.__new__


def text_response(body: bytes) -> HttpResponse:
    """``HttpResponse(200, body)`` (text/plain), made without ``__init__``'s checks: the answer
    to a handler's ``str``, the most common response."""
    response: HttpResponse = _new(HttpResponse)
    response.status = 200
    response.body = body
    response.headers = {"content-type": "text/plain; charset=utf-8"}
    response.close = False
    return response


def typed_response(status: int, body: bytes, content_type: str) -> HttpResponse:
    """``HttpResponse(status, body, content_type=content_type)``, made as
    :func:`text_response` is: a handle call's answer."""
    response: HttpResponse = _new(HttpResponse)
    response.status = status
    response.body = body
    response.headers = {"content-type": content_type}
    response.close = False
    return response


#: Chunks of a streamed body written less than this apart are a burst, written together.
BURST_S = 0.0005
#: The most bytes of a burst held before they are written.
BURST_BYTES = 64 * 1024


class _BurstWriter:
    """Writes the chunks of one streamed body, those of a burst together.

    A generator that yields many small items without waiting would cost a write per item (a
    syscall, and a sealed frame on a data-plane channel) here and a read per item at the caller.
    So the first chunk after the generator waited goes out at once; the next ones it yields
    without waiting, less than :data:`BURST_S` after the last write, are held and go out in one
    write as soon as the loop runs again (the generator waited for something), once
    :data:`BURST_BYTES` are held, or with the next chunk that comes :data:`BURST_S` or more after
    the last write (a generator that computes between items without ever waiting: what it
    yielded in a burst just before such a computation waits for its end, as every other request
    of the replica does). Owned by one ``_stream`` call, which flushes it at the end.
    """

    __slots__ = ("_held", "_held_bytes", "_last", "_scheduled", "_transport")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._last = -BURST_S
        self._scheduled = False

    def write(self, parts: tuple[bytes, ...]) -> bool:
        """Write or hold ``parts``; returns whether anything was written (flow control moved)."""
        now = time.perf_counter()
        if now - self._last >= BURST_S:
            self._last = now
            if not self._held:
                self._transport.writelines(parts)
                return True
            self._held.extend(parts)
            self.flush()
            return True
        self._held.extend(parts)
        self._held_bytes += sum(map(len, parts))
        if self._held_bytes >= BURST_BYTES:
            self.flush()
            return True
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush)
        return False

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        if self._held and not self._transport.is_closing():
            self.flush()
        self._last = -BURST_S  # the generator waited: its next chunk is a burst's first

    def flush(self, last: bytes = b"") -> None:
        """Write what is held (and ``last``) now, in one write."""
        held = self._held
        if last:
            held.append(last)
        if held:
            self._transport.writelines(held)
            self._held = []
            self._held_bytes = 0
            self._last = time.perf_counter()


class StreamedResponse:
    """A response whose body ``chunks`` produces; sent chunked (HTTP/1.1) or until close (1.0).

    An exception from ``chunks`` after the head was sent aborts the connection, so the client
    sees an incomplete body, never a clean end.
    """

    __slots__ = ("chunks", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], chunks: AsyncIterator[bytes]) -> None:
        self.status = status
        self.headers = headers
        self.chunks = chunks


Handler = Callable[[HttpRequest], Awaitable[HttpResponse | StreamedResponse]]
#: whether a request may be stepped by hand, outside a task (see ReplicaHttpServer): per
#: request, or the same for all
StepsByHand = Callable[[HttpRequest], bool] | bool
#: Serves a WebSocket handshake ``request`` on its ``session``: None once the session was served
#: (accepted, or refused by the app), or the HTTP answer to give instead of a socket.
WebSocketHandler = Callable[[HttpRequest, WebSocketSession], Awaitable[HttpResponse | None]]
#: Starts serving a request whose handler is a plain (sync) method, answered from its worker
#: thread (see :meth:`_Connection.answer_from_worker`); False: not for this request.
PlainStart = Callable[[HttpRequest, "_Connection", contextvars.Context], bool]


class _DateHeader:
    """``Date: ...\\r\\n``, formatted at most once per second."""

    __slots__ = ("current", "second")

    def __init__(self) -> None:
        #: the line of ``second`` (a caller may read it while ``int(time.time())`` is that)
        self.second = -1
        self.current = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.current = b"Date: %s\r\n" % http_date(now).encode("ascii")
        return self.current


class ReplicaHttpServer:
    """Shared state of every connection: the handlers, the open connections, the idle timeout.

    ``handler`` serves user traffic and ``control`` the internal endpoints. With a ``secret``,
    connections authenticate first (:class:`~kubeserve.runtime.channel.ServerChannel`: the
    handshake for replica ``identity``, then sealed frames) and their role chooses between the
    two; without one (a server measured on its own, or tested), every connection is user traffic.
    ``websocket`` serves the WebSocket handshakes of user traffic (their sockets pinged every
    ``websocket_ping_interval_s``, None: never); without it they are answered 501.
    ``steps_by_hand``: per role, whether a request may be stepped by hand (a rule per request,
    or a bool for all; by hand when none).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        control: Handler | None = None,
        secret: bytes | None = None,
        identity: str = "",
        keep_alive_timeout_s: float = 75.0,
        limits: RequestLimits | None = None,
        websocket: WebSocketHandler | None = None,
        websocket_ping_interval_s: float | None = PING_INTERVAL_S,
        steps_by_hand: dict[Role, StepsByHand] | None = None,
        plain: dict[Role, PlainStart] | None = None,
    ) -> None:
        if secret is not None and (control is None or not identity):
            raise ValueError("an authenticating server needs a control handler and an identity")
        self.handlers: dict[Role, Handler] = {Role.INGRESS: handler}
        if control is not None:
            self.handlers[Role.CONTROL] = control
        self.steps_by_hand = steps_by_hand or {}
        #: per role, how a request to a plain method starts when its answer may be written
        #: from the worker thread (sealed connections with the compiled extension only)
        self.plain = (plain or {}) if _send_now is not None else {}
        self.websocket = websocket
        self.websocket_ping_interval_s = websocket_ping_interval_s
        self.secret = secret
        self.identity = identity
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.limits = limits or RequestLimits()
        self.connections: set[ServerConnection] = set()
        self.date = _DateHeader()
        # Requests run in copies of the context the server was created in (see _Connection._next).
        self.context = contextvars.copy_context()

    def __call__(self) -> asyncio.Protocol:
        """The protocol factory for ``loop.create_server``."""
        if self.secret is None:
            return _Connection(self, Role.INGRESS)
        return ServerChannel(self.secret, self.identity, self._connection, log)

    def _connection(self, role: Role) -> asyncio.Protocol:
        return _Connection(self, role)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class _Connection(ServerConnection):
    """One client connection: parses requests, runs the handler, writes responses in order.

    ``clock`` (:class:`~kubeserve.runtime.limits.RequestClock`) holds the deadlines of the request
    being received and the connection's one timer; ``body_size`` counts its body against the cap.
    """

    def __init__(self, server: ReplicaHttpServer, role: Role) -> None:
        super().__init__(server.limits, server.keep_alive_timeout_s, server.connections)
        self.server = server
        self.handler = server.handlers[role]
        rule = server.steps_by_hand.get(role)
        self.by_hand = None if isinstance(rule, bool) else rule  # None: by hand (but see:)
        self.always_task = rule is False  # every request in a task
        self.ingress = role is Role.INGRESS
        self.role = role
        # The request being parsed, and requests parsed but not yet served (pipelining).
        self.in_message = False
        self.head_done = False
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.request_id = ""
        self.model_id: str | None = None  # the first serve_multiplexed_model_id header's value
        self.expect = False  # Expect: 100-continue
        self.declared = 0  # Content-Length
        self.body: list[bytes] = []
        self.body_size = 0
        self.queue: deque[HttpRequest] = deque()
        self.serving: HttpRequest | None = None
        self.task: asyncio.Task[None] | None = None  # a strong reference while a handler waits
        # A protocol upgrade: the request's Upgrade header (reset once its request is complete),
        # the request httptools stopped after, then the WebSocket the connection became.
        self.upgrade = b""
        self.upgrading: tuple[HttpRequest, bytes] | None = None
        self.session: WebSocketSession | None = None
        self.ws_request: HttpRequest | None = None  # a handshake waiting for pipelined requests
        self.inflow: Inflow | None = None  # the body of the duplex call being served, arriving
        # Frames opened here, answers sealed here (see opens_frames), or None.
        self.opener: Any = None
        self.raw: asyncio.Transport | None = None
        self.seal_answer: Callable[..., bytes | None] | None = None
        self.plain: PlainStart | None = None  # (set with the sealed frames: opens_frames)
        #: the socket of a connection whose answers worker threads may write: a descriptor of
        #: its own (see answer_from_worker), closed once the connection is lost and no worker
        #: holds an answer for it (``answering``)
        self.fd = -1
        self.answering = False
        self.lost = False

    def opens_frames(self, opener: Any, raw: asyncio.Transport) -> bool:
        """Take the sealed channel's frames straight from ``raw`` (see
        :class:`~kubeserve.runtime.sealing.SealedProtocol`): ``opener`` (the compiled one) opens
        them and parses the whole common requests in them in one call, and a complete answer is
        formatted and sealed in one (:meth:`_write_head`); the rest is as over the sealed
        transport. Only with the compiled parse (anything it leaves goes to httptools)."""
        if _parse_request is None:
            return False
        limits = self.limits
        max_body = limits.max_body_bytes
        opener.serve_requests(
            HttpRequest,
            limits.max_url_bytes,
            limits.max_header_bytes,
            -1 if max_body is None else max_body,
            b"" if self.ingress else _DUPLEX,  # a duplex call is served as its body arrives
            self.ingress,  # user traffic without a request id gets a new one
        )
        self.opener = opener
        self.raw = raw
        self.seal_answer = self.transport.sealer.seal_answer  # type: ignore[attr-defined]
        plain = self.server.plain.get(self.role)
        sock = raw.get_extra_info("socket")
        # (the socket's own bytes are the channel's frames: never under TLS, which the replica's
        # listener does not have; checked all the same)
        if plain is not None and sock is not None and raw.get_extra_info("ssl_object") is None:
            self.fd = os.dup(sock.fileno())
            self.plain = plain
        return True

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        opener = self.opener
        if opener is not None:  # sealed frames, straight from the raw transport
            try:
                if self.in_message:
                    data = opener.feed(data)
                else:
                    self.read_size = len(data)
                    requests, data = opener.feed_requests(data)
            except FrameError as exc:
                frame_failed(self.transport, exc)
                return
            if not self.in_message:
                queue = self.queue
                for request in requests:  # _queue's, written out
                    if self.closed:
                        return
                    queue.append(request)
                    if self.serving is None:
                        self._next()
                    elif len(queue) >= _PIPELINE_LIMIT:
                        self.hold_reading(True)
                if self.closed:
                    return
            if not data:
                return
        elif _parse_request is not None and not self.in_message:
            data = self._parse_whole(data)
            if not data:
                return
        # The read ended inside a request: note it for the timeouts, bound what its head buffers.
        if self.feed(data) and self.in_message and not self.closed:
            self.note_partial(self.head_done)

    def _parse_whole(self, data: bytes) -> bytes:
        """Compiled parse: the whole common requests at the start of ``data`` (between
        requests only: httptools holds no partial request), each in one call to
        ``kubeserve._native.parse_request``; returns what is left for httptools (whatever
        that parse leaves to it, errors and limits included: see ``native/pyext``)."""
        limits = self.limits
        max_body = limits.max_body_bytes
        size = self.read_size = len(data)
        start = 0
        while not self.closed:
            parsed = _parse_request(  # type: ignore[misc]
                data,
                start,
                limits.max_url_bytes,
                limits.max_header_bytes,
                -1 if max_body is None else max_body,
            )
            if parsed is None:
                break
            method, path, query, headers, body, request_id, keep_alive, end, model_id = parsed
            if not self.ingress and path.startswith(DUPLEX_PREFIX):
                break  # a duplex call is served as its body arrives: httptools' callbacks
            if not request_id and self.ingress:
                request_id = new_request_id().decode("ascii")
            start = end
            self._queue(
                HttpRequest(
                    method, path, query, headers, body, keep_alive, False, request_id, model_id
                )
            )
            if start == size:
                return b""
        if self.closed:
            return b""
        return data[start:] if start else data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.answering:
            self._close_fd()
        self.queue.clear()
        if self.inflow is not None:
            self.inflow.lost(f"connection lost: {exc or 'closed'}")
        serving, task = self.serving, self.task
        if (
            task is not None
            and serving is not None
            and self.session is None
            and (self.ingress or serving.path.startswith(CALL_PREFIX))
        ):
            # The caller went away before the answer's end (an HTTP client that disconnected or
            # timed out, a gRPC client's cancel or deadline, a cancelled DeploymentResponse: the
            # proxy or handle closes the connection): nobody reads the answer, so the handler's
            # task is cancelled, as Ray cancels it; a streamed body stops. (A sync method's
            # worker thread cannot be interrupted: it runs to its end. A WebSocket's app gets
            # ``websocket.disconnect`` instead.)
            task.cancel()
        super().connection_lost(exc)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.head_done = self.expect = False
        self.url = b""
        self.headers = []
        self.request_id = ""
        self.model_id = None
        self.body = []
        self.body_size = self.declared = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.check_url(self.url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # Decoded as aiohttp and the ASGI servers do: UTF-8, undecodable bytes kept as surrogates.
        header = (name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
        self.headers.append(header)
        # The few names that matter, told apart by length first (and X-Request-Id from
        # Content-Type, the usual other 12-letter name, by its first letter).
        size = len(name)
        if size == 12:
            if name[0] | 0x20 == 0x78 and name.lower() == REQUEST_ID:
                self.request_id = self.request_id or header[1]
        elif size == 14:
            if name.lower() == b"content-length" and value.isdigit():
                self.declared = int(value)
        elif size == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            self.expect = True
        elif size == 7 and name.lower() == b"upgrade":
            self.upgrade = value
        elif size == 26 and self.model_id is None and name.lower() == _MODEL_ID:
            self.model_id = header[1]

    def on_headers_complete(self) -> None:
        self.head_done = True
        limits = self.limits
        if self.clock.head_may_be_too_large(self.read_size):
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > limits.max_header_bytes:
                raise RequestRefused(431, head_too_large(limits.max_header_bytes))
        cap = limits.max_body_bytes
        if cap is not None and self.declared > cap:  # refused before a byte of the body is read
            raise RequestRefused(413, body_too_large(cap))
        if self.expect:
            self.transport.write(_CONTINUE)  # the client waits for this before the body
        if not self.ingress and self.url.startswith(_DUPLEX):
            self.duplex()

    def duplex(self) -> None:
        """Serve the duplex call whose head was just parsed now, its body fed to it as it comes:
        neither the body cap nor the body timeout apply (a client stream may last)."""
        request = HttpRequest(
            "POST", self.url.decode("latin-1"), "", self.headers, b"", False, False, ""
        )
        request.inflow = self.inflow = Inflow(self.hold_reading)
        self.in_message = False
        self.queue.append(request)
        if self.serving is None:
            self._next()

    def on_body(self, body: bytes) -> None:
        if self.inflow is not None:
            self.inflow.feed(body)
            return
        self.body_size += len(body)
        cap = self.limits.max_body_bytes
        if cap is not None and self.body_size > cap:  # chunked: the length was not declared
            raise RequestRefused(413, body_too_large(cap))
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self.inflow is not None:
            inflow, self.inflow = self.inflow, None
            inflow.end()
            return
        parser = self.parser
        path, _, query = self.url.partition(b"?")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request_id = self.request_id
        if not request_id and self.ingress:
            request_id = new_request_id().decode("ascii")
        request = HttpRequest(
            parser.get_method().decode("ascii"),
            normalize_path(path.decode("latin-1"))
            if needs_normalizing(path)
            else path.decode("utf-8", "surrogateescape"),
            query.decode("utf-8", "surrogateescape"),
            self.headers,
            body,
            parser.should_keep_alive(),
            parser.get_http_version() == "1.0",
            request_id,
            self.model_id or "",
        )
        if self.upgrade:  # rare: only requests with an Upgrade header look at it
            upgrade, self.upgrade = self.upgrade, b""
            if parser.should_upgrade():  # httptools stops after this request: see upgraded()
                self.upgrading = (request, upgrade)
                return
        self._queue(request)

    def _queue(self, request: HttpRequest) -> None:
        """A whole request was parsed: serve it now, or after those before it."""
        self.queue.append(request)
        if self.serving is None:
            self._next()
        elif len(self.queue) >= _PIPELINE_LIMIT:
            self.hold_reading(True)

    # -- serving ---------------------------------------------------------------------------------

    def _next(self) -> None:
        """Serve queued requests in order until one has to wait; with none left, go idle."""
        queue = self.queue
        self.task = None
        while queue and not self.closed:
            request = self.serving = queue.popleft()
            if not self.reading and len(queue) < _PIPELINE_LIMIT // 2:
                self.hold_reading(False)
            # Handler run eagerly: step the coroutine here; only one that really suspends (awaits
            # I/O or another deployment) becomes a task. A sync or CPU-only handler finishes in
            # this call, which saves creating and scheduling a task per request. Each request
            # runs in its own copy of the server's context, as a task would, so context variables
            # never leak from one request into the next.
            context = self.server.context.copy()
            plain = self.plain
            if plain is not None and plain(request, self, context):
                return  # answered from a worker thread: see answer_from_worker
            by_hand = self.by_hand
            if self.always_task or (by_hand is not None and not by_hand(request)):
                # User coroutines run in a task from their first step, as Ray runs requests:
                # asyncio.timeout, a TaskGroup, aiohttp's and anyio's timeouts need one.
                self.task = self.loop.create_task(self._serve(request, True), context=context)
                return
            coro = self._serve(request)
            try:
                yielded = context.run(coro.send, None)
            except StopIteration:
                continue
            self._wait(coro, context, yielded)
            return
        self.serving = None
        if self.ws_request is not None:  # a WebSocket handshake pipelined behind requests
            self._start_websocket()
            return
        self.idle_since = self.loop.time()

    def _wait(
        self, coro: Coroutine[Any, Any, None], context: contextvars.Context, yielded: Any
    ) -> None:
        """The handler stepped by hand waits for ``yielded``. Handler waiting on a worker thread
        (a sync method: the common wait): the thread hop steps it on in the very callback that
        completes the call (no task, no loop iteration in between). Any other wait: a task
        finishes it."""
        hop = current_hop()
        if hop is None or not hop.then(yielded, functools.partial(self._after_hop, coro, context)):
            self.task = self.loop.create_task(_resume(coro, yielded, self._next), context=context)

    def answer_from_worker(
        self, status: int, headers: dict[str, str], body: bytes, request: HttpRequest
    ) -> bytes:
        """On a worker thread, holding the GIL: the answer to the request being served, formatted
        and sealed, and written to the socket as far as it takes it now; returns what is left
        for :meth:`answered` to write on the loop (b"": nothing). Raises ValueError for an
        answer the compiled formatting leaves to the loop's (nothing written then).

        Why from the worker: a sync handler's answer then leaves as soon as its call returns,
        not after the loop has been woken and has stepped the request on (under load, a batch of
        calls' answers would otherwise all wait for the batch's end, and the proxy and client
        with them). Why it is safe: the connection serves one request at a time, so nothing
        else writes to it until :meth:`answered` runs; the sealer's state is this connection's
        answers' alone (its calls keep the GIL); the write is made only when the event loop
        holds nothing unwritten for the socket (else everything goes through the loop, in
        order); and it goes to a descriptor of the connection's own (``fd``, a ``dup``), which
        stays open until the worker is through (``answering``), so a socket the loop closes
        meanwhile can never be another connection's by the time of the write."""
        seal_answer = self.seal_answer
        raw = self.raw
        if self.closed or seal_answer is None or raw is None or raw.is_closing():
            return b""
        date = self.server.date
        whole = seal_answer(
            status,
            _REASONS.get(status, b"Unknown"),
            date.current if int(time.time()) == date.second else date.line(),
            request.request_id,
            headers,
            body,
            request.keep_alive,
        )
        if whole is None:  # (a header the compiled answer leaves to the loop's path)
            raise ValueError("the answer needs the loop's formatting")
        if raw.get_write_buffer_size():
            return whole  # the loop still writes earlier bytes: after them, in order
        try:
            sent = _send_now(self.fd, whole)  # type: ignore[misc]
        except OSError:  # the peer is gone: the loop sees the connection lost
            return b""
        return whole[sent:] if sent else whole

    def answered(
        self, request: HttpRequest, rest: bytes, response: HttpResponse | None = None
    ) -> None:
        """On the loop, after :meth:`answer_from_worker`: write what it left (or ``response``,
        when the worker wrote nothing), then serve the next request (or close)."""
        self._worker_through()
        keep_alive = request.keep_alive
        if response is not None:
            keep_alive = keep_alive and not response.close and not self.closed
            self._write_head(
                response.status, response.headers, response.body, keep_alive, request.request_id
            )
        elif rest and not self.closed and self.raw is not None:
            self.raw.write(rest)
        if not keep_alive:
            self.close()
        self._next()

    def resume(
        self,
        request: HttpRequest,
        answer: Coroutine[Any, Any, HttpResponse | StreamedResponse],
        context: contextvars.Context,
    ) -> None:
        """On the loop: a request :attr:`plain` started is answered the common way after all
        (the handler raised, or returned anything else than a ``str``): ``answer`` makes the
        response."""
        self._worker_through()
        self._after_hop(self._serve(request, answer=answer), context)

    def _worker_through(self) -> None:
        """No worker holds an answer for this connection any more: its descriptor may close."""
        self.answering = False
        if self.lost:
            self._close_fd()

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def _after_hop(self, coro: Coroutine[Any, Any, None], context: contextvars.Context) -> None:
        """The worker thread's call the handler waited for is complete (or, from :meth:`resume`,
        the handler has not started yet): step it on."""
        try:
            yielded = context.run(coro.send, None)
        except StopIteration:
            self._next()
            return
        except BaseException:
            self._next()
            raise
        self._wait(coro, context, yielded)

    async def _serve(
        self,
        request: HttpRequest,
        in_task: bool = False,
        answer: Awaitable[HttpResponse | StreamedResponse] | None = None,
    ) -> None:
        """Answer ``request``; ``in_task``: this is the task serving it, which serves the
        requests queued behind it once done (:meth:`_next`), however it ends. ``answer``: the
        response's awaitable, when the handler was already called (see :meth:`resume`)."""
        try:
            try:
                response = await (self.handler(request) if answer is None else answer)
            except Exception:  # the handler maps user errors itself; this is a kubeserve bug
                log.exception(
                    "%s %s failed in kubeserve's handler (request id %s)",
                    request.method,
                    request.path,
                    request.request_id,
                )
                response = internal_error(request.request_id, close=True)
            keep_alive = request.keep_alive and not self.closed
            if isinstance(response, HttpResponse):
                keep_alive = keep_alive and not response.close
                self._write_head(
                    response.status, response.headers, response.body, keep_alive,
                    request.request_id,
                )  # fmt: skip
            else:
                keep_alive = keep_alive and not request.http10  # 1.0: the body ends with close
                keep_alive = await self._stream(response, request, keep_alive)
            if not keep_alive:
                self.close()
        finally:
            if in_task:
                self._next()

    def _write_head(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes | None,
        keep_alive: bool,
        request_id: str = "",
    ) -> None:
        """The status line and headers (and ``body``, when given) in one ``writelines``."""
        if self.closed:
            return
        seal_answer = self.seal_answer
        if seal_answer is not None:  # formatted and sealed in one call (see opens_frames)
            date = self.server.date
            whole = seal_answer(
                status,
                _REASONS.get(status, b"Unknown"),
                date.current if int(time.time()) == date.second else date.line(),
                request_id,
                headers,
                body,
                keep_alive,
            )
            if whole is not None:
                self.raw.write(whole)  # type: ignore[union-attr]
                return
        if _answer is not None:
            whole = _answer(
                status,
                _REASONS.get(status, b"Unknown"),
                self.server.date.line(),
                request_id,
                headers,
                body,
                keep_alive,
            )
            if whole is not None:
                self.transport.write(whole)
                return
        out = [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown")),
            self.server.date.line(),
        ]
        if request_id and "x-request-id" not in headers:
            out.append(b"x-request-id: %s\r\n" % request_id.encode("latin-1", "replace"))
        lines = _HEADER_LINES
        for header in headers.items():
            line = lines.get(header)
            if line is None:
                line = b"%s: %s\r\n" % (header[0].encode("latin-1"), header[1].encode("latin-1"))
                if len(lines) < _HEADER_LINES_KEPT and len(line) <= 256:
                    lines[header] = line
            out.append(line)
        if body is not None:
            out.append(b"Content-Length: %d\r\n" % len(body))
        if not keep_alive:
            out.append(b"Connection: close\r\n")
        out.append(_CRLF)
        if body:
            out.append(body)
        self.transport.writelines(out)

    async def _stream(
        self, response: StreamedResponse, request: HttpRequest, keep_alive: bool
    ) -> bool:
        """Send a streamed body; returns whether the connection can serve another request."""
        chunked = not request.http10
        headers = dict(response.headers)
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        self._write_head(response.status, headers, None, keep_alive, request.request_id)
        chunks = response.chunks
        writer = _BurstWriter(self.transport)
        try:
            async for chunk in chunks:
                if self.closed:  # the client left: stop producing
                    return False
                if chunk:
                    parts = (b"%x\r\n" % len(chunk), chunk, _CRLF) if chunked else (chunk,)
                    # backpressure: a slow client slows the generator
                    if writer.write(parts) and self.write_paused:
                        await self.drain()
        except Exception:
            self.transport.abort()  # the client must not mistake a cut body for a complete one
            return False
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if not self.closed:
            writer.flush(_CHUNKED_END if chunked else b"")
        return keep_alive

    def refuse(self, status: int, message: bytes) -> None:
        rid = self.request_id or (new_request_id().decode() if self.ingress else "")
        self._write_head(status, {"content-type": "text/plain; charset=utf-8"}, message, False, rid)
        self.close_lingering()

    def close(self) -> None:
        if self.session is not None:  # a socket still open (the server stops): 1001
            # The session closes the transport, once the client answered its close frame.
            self.session.close(GOING_AWAY, "server shutting down")
            self.closed = True
            return
        if not self.closed:
            self.closed = True  # at once: no queued request is served after this
            self.transport.close()  # flushes what is buffered, then closes

    def upgraded(self, rest: bytes) -> None:
        """A WebSocket handshake on user traffic becomes a :class:`WebSocketSession`, the
        transport's protocol from now on; any other upgrade (h2c, CONNECT...) is refused."""
        upgrading, self.upgrading = self.upgrading, None
        handler = self.server.websocket
        if upgrading is None or not is_websocket(upgrading[1]):
            what = b"CONNECT" if upgrading is None else b"upgrading to " + upgrading[1][:64]
            self.refuse(501, b"%s is not supported: WebSocket is the only upgrade" % what)
            return
        if handler is None or not self.ingress:
            self.refuse(501, b"this server takes no WebSocket")
            return
        request = upgrading[0]
        headers = [
            (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
            for name, value in request.headers
        ]
        self.session = WebSocketSession(
            self.transport,
            headers,
            self.url,
            max_message_bytes=self.limits.max_body_bytes,
            early=rest,
            on_lost=self.connection_lost,
            ping_interval_s=self.server.websocket_ping_interval_s,
            send_timeout_s=self.limits.send_timeout_s,
        )
        self.transport.set_protocol(self.session)
        self.clock.cancel()  # no keep-alive or request timeouts on a socket
        self.ws_request = request
        if self.serving is None and not self.queue:
            self._start_websocket()

    def _start_websocket(self) -> None:
        """Serve the WebSocket (the connection's last request): the handler runs as long as
        the socket is open."""
        request, self.ws_request = self.ws_request, None
        session = self.session
        assert request is not None and session is not None
        if self.closed:  # a request before it closed the connection: no socket
            return
        self.serving = request
        self.task = self.loop.create_task(
            self._serve_websocket(request, session), context=self.server.context.copy()
        )

    async def _serve_websocket(self, request: HttpRequest, session: WebSocketSession) -> None:
        handler = self.server.websocket
        assert handler is not None
        response: HttpResponse | None
        if session.invalid:
            response = HttpResponse(
                400, b"invalid WebSocket handshake: %s" % session.invalid.encode("utf-8", "replace")
            )
        else:
            try:
                response = await handler(request, session)
            except Exception:  # the handler maps user errors itself; this is a kubeserve bug
                log.exception(
                    "WebSocket %s failed in kubeserve's handler (request id %s)",
                    request.path,
                    request.request_id,
                )
                response = internal_error(request.request_id)
        if session.state is SessionState.CONNECTING:  # no socket: an HTTP answer instead
            session.refused()
            if response is None:
                response = internal_error(request.request_id)
            self._write_head(
                response.status, response.headers, response.body, False, request.request_id
            )
        self.close()

    def time_left(self, now: float) -> float | None:
        """Keep-alive timeout when idle, head and body timeouts while a request arrives."""
        if self.in_message and self.serving is None and not self.queue:
            remaining, late = self.clock.overdue(self.head_done, self.reading, now)
            if remaining <= 0:
                limits = self.limits
                log.info(
                    "closed a connection from %s: request %s not received within %.0f s",
                    peer_description(self.transport),
                    late,
                    limits.header_timeout_s if late == "head" else limits.body_timeout_s,
                )
                self.refuse(408, b"request %s not received in time" % late.encode())
                return None
            return remaining
        if self.serving is None and not self.queue:
            return self.idle_time_left(now)
        return self.limits.shortest_timeout_s  # serving: the handler's time is not limited here


def internal_error(request_id: str, *, close: bool = False) -> HttpResponse:
    """The 500 of an exception nobody handled: only the request id, never the exception's text
    (it may hold secrets); the replica's log has the traceback under the same id."""
    return HttpResponse(
        500, b"Internal Server Error (request id %s)" % request_id.encode(), close=close
    )


async def _resume(coro: Coroutine[Any, Any, None], yielded: Any, then: Callable[[], None]) -> None:
    """Finish a coroutine that ``_Connection._next`` started stepping by hand, the way a task
    would: wait for the future it yielded (``None`` means "run me again soon"), then step it again
    (the future's outcome reaches the coroutine through that future's own ``__await__``). Calls
    ``then`` once the coroutine is done."""
    try:
        while True:
            error: BaseException | None = None
            if yielded is None:
                await asyncio.sleep(0)
            else:
                # Taken over from the coroutine, as Task.__step does, so it can be awaited here.
                yielded._asyncio_future_blocking = False
                try:
                    await yielded
                except BaseException as exc:
                    error = exc
            try:
                # A failed future's error is thrown in, as a task throws it: its traceback (the
                # frames of a worker thread, say) is handed over once, and a second read of the
                # future would give it without them.
                yielded = coro.send(None) if error is None else coro.throw(error)
            except StopIteration:
                break
    finally:
        then()
