"""The replica's HTTP/1.1 server: ``asyncio.Protocol`` + httptools, one request at a time per
connection (pipelined requests wait their turn, in order).

Why not a web framework: every user request and handle call crosses this server, and a framework
server builds a request object with header multidicts, a payload stream and a response object per
request, costing more CPU than the no-op user code it serves. Here a request is one
:class:`HttpRequest` (plain strings and bytes) and a response is written with one ``writelines``.
The tricks, each marked where it is used:

* **Handler run eagerly**: the handler coroutine is stepped inside ``data_received``; a task is
  created only when it actually waits (a sync user method never needs one).
* **Write coalescing**: status line, headers and body go out in one ``writelines`` (one syscall).
* **Cached Date header**, re-formatted once per second instead of per response.
* **Lazy idle timer**: one timer per connection that re-arms itself, instead of a timer per request.

The server knows nothing about deployments: :class:`~kubeserve.runtime.replica.Replica` gives it a
handler ``HttpRequest -> HttpResponse | StreamedResponse`` per channel role. With a secret, every
connection must pass the :mod:`~kubeserve.runtime.channel` handshake before a byte of it is parsed,
and its role picks its handler for good: user traffic (``INGRESS``) or internal endpoints
(``CONTROL``). Invariants: a connection runs at most one handler at a time; ``close_idle``
closes every connection with no request in progress, and a response with ``close=True`` ends its
connection once written.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from kubeserve.runtime.channel import (
    HANDSHAKE_TIMEOUT_S,
    ChannelError,
    Role,
    ServerHandshake,
    peer_description,
)

__all__ = ["HttpRequest", "HttpResponse", "ReplicaHttpServer", "StreamedResponse"]

log = logging.getLogger(__name__)

#: Requests parsed ahead of the one being served before the connection stops reading.
_PIPELINE_LIMIT = 16
_CRLF = b"\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CHUNKED_END = b"0\r\n\r\n"
_REASONS = {s.value: s.phrase.encode("ascii") for s in HTTPStatus}


class HttpRequest:
    """One request with its whole body; ``path`` percent-decoded, ``headers`` as sent, in order."""

    __slots__ = ("body", "headers", "http10", "keep_alive", "method", "path", "query_string")

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: list[tuple[str, str]],
        body: bytes,
        keep_alive: bool,
        http10: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10


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


class _DateHeader:
    """``Date: ...\\r\\n``, formatted at most once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: %s\r\n" % formatdate(now, usegmt=True).encode("ascii")
        return self._line


class ReplicaHttpServer:
    """Shared state of every connection: the handlers, the open connections, the idle timeout.

    ``handler`` serves user traffic and ``control`` the internal endpoints. With a ``secret``,
    connections authenticate first and their role chooses between the two; without one (a server
    measured on its own, or tested), every connection is user traffic.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        control: Handler | None = None,
        secret: bytes | None = None,
        keep_alive_timeout_s: float = 75.0,
    ) -> None:
        if secret is not None and control is None:
            raise ValueError("an authenticating server needs a control handler")
        self.handlers: dict[Role, Handler] = {Role.INGRESS: handler}
        if control is not None:
            self.handlers[Role.CONTROL] = control
        self.secret = secret
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.connections: set[_Connection] = set()
        self.date = _DateHeader()
        # Requests run in copies of the context the server was created in (see _Connection._next).
        self.context = contextvars.copy_context()

    def __call__(self) -> asyncio.Protocol:
        """The protocol factory for ``loop.create_server``."""
        return _Connection(self)

    def close_idle(self) -> None:
        """Close connections with no request in progress (after a drain, before exiting)."""
        for conn in list(self.connections):
            if conn.serving is None:
                conn.close()

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler, writes responses in order."""

    def __init__(self, server: ReplicaHttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.handshake: ServerHandshake | None = None
        self.handler = server.handlers[Role.INGRESS]
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.reading = True
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        # The request being parsed, and requests parsed but not yet served (pipelining).
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.queue: deque[HttpRequest] = deque()
        self.serving: HttpRequest | None = None
        self.task: asyncio.Task[None] | None = None  # a strong reference while a handler waits
        self.idle_since = 0.0
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set on connect
        self.idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        # Kept, not looked up per request: on Python 3.11 get_running_loop() costs a getpid().
        self.loop = asyncio.get_running_loop()
        self.idle_since = self.loop.time()
        if self.server.secret is not None:
            self.handshake = ServerHandshake(self.server.secret, self.transport.write)
            self.loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_expired)
        self._check_idle()

    def data_received(self, data: bytes) -> None:
        if self.handshake is not None:
            data = self._authenticate(data)
            if not data:
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(501, b"protocol upgrades are not supported")
        except httptools.HttpParserError:
            self._reject(400, b"malformed HTTP request")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.queue.clear()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self._wake_writer()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def _authenticate(self, data: bytes) -> bytes:
        """Feed the handshake; the bytes after the caller's proof once it passed, else b""."""
        assert self.handshake is not None
        try:
            rest = self.handshake.feed(data)
        except ChannelError as exc:
            log.warning("refused a connection from %s: %s", peer_description(self.transport), exc)
            self.closed = True
            self.transport.abort()
            return b""
        if rest is None:
            return b""
        role = self.handshake.role
        assert role is not None
        self.handler = self.server.handlers[role]
        self.handshake = None
        return rest

    def _handshake_expired(self) -> None:
        if self.handshake is not None and not self.closed:
            log.warning(
                "refused a connection from %s: no handshake within %.0f s",
                peer_description(self.transport),
                HANDSHAKE_TIMEOUT_S,
            )
            self.closed = True
            self.transport.abort()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Decoded as aiohttp and the ASGI servers do: UTF-8, undecodable bytes kept as surrogates.
        self.headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        for name, value in self.headers:
            if len(name) == 6 and name.lower() == "expect" and value.lower() == "100-continue":
                self.transport.write(_CONTINUE)  # the client waits for this before the body

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        path, _, query = self.url.partition(b"?")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = HttpRequest(
            parser.get_method().decode("ascii"),
            unquote(path.decode("utf-8", "surrogateescape")),
            query.decode("utf-8", "surrogateescape"),
            self.headers,
            body,
            parser.should_keep_alive(),
            parser.get_http_version() == "1.0",
        )
        self.queue.append(request)
        if self.serving is None:
            self._next()
        elif len(self.queue) >= _PIPELINE_LIMIT and self.reading:
            self.reading = False
            self.transport.pause_reading()

    # -- serving ---------------------------------------------------------------------------------

    def _next(self) -> None:
        """Serve queued requests in order until one has to wait; with none left, go idle."""
        queue = self.queue
        self.task = None
        while queue and not self.closed:
            request = self.serving = queue.popleft()
            if not self.reading and len(queue) < _PIPELINE_LIMIT // 2:
                self.reading = True
                self.transport.resume_reading()
            # Handler run eagerly: step the coroutine here; only one that really suspends (awaits
            # I/O or another deployment) becomes a task. A sync or CPU-only handler finishes in
            # this call, which saves creating and scheduling a task per request. Each request
            # runs in its own copy of the server's context, as a task would, so context variables
            # never leak from one request into the next.
            coro = self._serve(request)
            context = self.server.context.copy()
            try:
                yielded = context.run(coro.send, None)
            except StopIteration:
                continue
            self.task = self.loop.create_task(_resume(coro, yielded, self._next), context=context)
            return
        self.serving = None
        self.idle_since = self.loop.time()

    async def _serve(self, request: HttpRequest) -> None:
        try:
            response = await self.handler(request)
        except Exception:  # the handler maps user errors itself; this is a kubeserve bug
            response = HttpResponse(500, b"internal error in the replica", close=True)
        keep_alive = request.keep_alive and not self.closed
        if isinstance(response, HttpResponse):
            keep_alive = keep_alive and not response.close
            self._write_head(response.status, response.headers, response.body, keep_alive)
        else:
            keep_alive = keep_alive and not request.http10  # 1.0: the body ends with the close
            keep_alive = await self._stream(response, request, keep_alive)
        if not keep_alive:
            self.close()

    def _write_head(
        self, status: int, headers: dict[str, str], body: bytes | None, keep_alive: bool
    ) -> None:
        """The status line and headers (and ``body``, when given) in one ``writelines``."""
        if self.closed:
            return
        out = [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown")),
            self.server.date.line(),
        ]
        for name, value in headers.items():
            out.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
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
        self._write_head(response.status, headers, None, keep_alive)
        chunks = response.chunks
        try:
            async for chunk in chunks:
                if self.closed:  # the client left: stop producing
                    return False
                if chunk:
                    if chunked:
                        self.transport.writelines((b"%x\r\n" % len(chunk), chunk, _CRLF))
                    else:
                        self.transport.write(chunk)
                    if self.write_paused:  # backpressure: a slow client slows the generator
                        await self._drain()
        except Exception:
            self.transport.abort()  # the client must not mistake a cut body for a complete one
            return False
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if chunked and not self.closed:
            self.transport.write(_CHUNKED_END)
        return keep_alive

    async def _drain(self) -> None:
        if self.write_paused and not self.closed:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    def _wake_writer(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _reject(self, status: int, message: bytes) -> None:
        self._write_head(status, {"content-type": "text/plain; charset=utf-8"}, message, False)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()  # flushes what is buffered, then closes

    def _check_idle(self) -> None:
        # Lazy idle timer: re-armed for the remaining time instead of reset on every request.
        loop = self.loop
        timeout = self.server.keep_alive_timeout_s
        remaining = timeout - (loop.time() - self.idle_since)
        if self.serving is None and not self.queue and remaining <= 0:
            self.idle_timer = None
            self.close()
            return
        self.idle_timer = loop.call_later(max(remaining, 0.0) or timeout, self._check_idle)


async def _resume(coro: Coroutine[Any, Any, None], yielded: Any, then: Callable[[], None]) -> None:
    """Finish a coroutine that ``_Connection._next`` started stepping by hand, the way a task
    would: wait for the future it yielded (``None`` means "run me again soon"), then step it again
    (the future's outcome reaches the coroutine through that future's own ``__await__``). Calls
    ``then`` once the coroutine is done."""
    try:
        while True:
            if yielded is None:
                await asyncio.sleep(0)
            else:
                # Taken over from the coroutine, as Task.__step does, so it can be awaited here.
                yielded._asyncio_future_blocking = False
                with contextlib.suppress(BaseException):
                    await yielded
            try:
                yielded = coro.send(None)
            except StopIteration:
                break
    finally:
        then()
