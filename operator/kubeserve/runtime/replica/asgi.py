"""ASGI on the replica side: an ``@ingress`` app (FastAPI, Starlette, any ASGI callable), the
Starlette ``Request`` plain ingress deployments receive, and Starlette responses user code returns.

The replica's HTTP server hands over one complete request (:class:`~kubeserve.runtime.replica.http.
HttpRequest`); :func:`run_asgi` turns it into an ASGI ``http`` scope and runs the app:

* the scope's ``path`` is the full path the client asked for and ``root_path`` the application's
  route prefix (empty for ``/``), as Ray Serve sets them, so FastAPI's ``/docs`` and
  ``/openapi.json`` live under the prefix and ``url_for`` builds prefixed URLs;
* a response sent in one body message becomes a complete response (``Content-Length``); one sent
  in several (``StreamingResponse``) is streamed chunk by chunk as the app sends it, never
  buffered whole, with the app paused while the client is slower (a bounded queue);
* ``receive`` gives the body, then ``http.disconnect`` once the response is done or the client
  left, so Starlette's disconnect listeners end.

A WebSocket handshake (:func:`run_websocket`) runs the app with a ``websocket`` scope (the same
paths, ``ws`` scheme, the offered ``subprotocols``) over a :class:`~kubeserve.runtime.websocket.
WebSocketSession`: ``websocket.connect`` first, then the client's messages and a
``websocket.disconnect`` with the close code; the app's ``websocket.accept`` writes the ``101``,
``websocket.send`` and ``websocket.close`` frame as they should. An app that closes before
accepting refuses the handshake with a ``403`` (as uvicorn does), or with the response it sends
through the ``websocket.http.response`` extension; one that fails before accepting gives a
``500``, after accepting a close with ``1011``.

:class:`Lifespan` runs the app's ``lifespan`` startup before the replica listens and its shutdown
after it drained; an app that does not speak the lifespan protocol is simply not told.

Starlette is optional: without it plain ingress deployments receive kubeserve's own
:class:`~kubeserve.sdk.http.Request`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

from kubeserve.runtime.replica.http import HttpRequest, HttpResponse, internal_error
from kubeserve.runtime.websocket import (
    INTERNAL_ERROR,
    NORMAL_CLOSURE,
    SessionState,
    WebSocketGone,
    WebSocketSession,
)
from kubeserve.sdk.http import Request, StreamingResponse

__all__ = [
    "Lifespan",
    "http_scope",
    "is_asgi_response",
    "prepare",
    "run_asgi",
    "run_websocket",
    "user_request",
    "websocket_scope",
]

log = logging.getLogger("kubeserve.replica")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[MutableMapping[str, Any], Receive, Send], Coroutine[Any, Any, None]]

#: Body messages an app may send ahead of a slow client before ``send`` waits.
_STREAM_AHEAD = 16
#: Response headers the replica's server writes itself.
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})
_ASGI = {"version": "3.0", "spec_version": "2.3"}
#: 2.4: ``reason`` on close and disconnect, an ``OSError`` from ``send`` once the socket is closed
_ASGI_WEBSOCKET = {"version": "3.0", "spec_version": "2.4"}
#: The status recorded for a WebSocket whose connection ended before the app answered it.
_CLIENT_LEFT = 499


def root_path_of(route_prefix: str | None) -> str:
    return "" if not route_prefix or route_prefix == "/" else route_prefix


def http_scope(
    request: HttpRequest, root_path: str, state: dict[str, Any] | None = None, mount: str = ""
) -> dict[str, Any]:
    """The ASGI ``http`` scope of ``request`` (see the module docstring for the paths); ``mount``
    (``http_options.root_path``) is put back before the path a reverse proxy stripped it from."""
    path = mount + request.path if mount else request.path
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in request.headers
    ]
    client = None
    for name, value in request.headers:
        if name.lower() == "x-forwarded-for" and value:
            client = (value.split(",")[0].strip(), 0)
            break
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": _ASGI,
        "http_version": "1.0" if request.http10 else "1.1",
        "method": request.method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": request.query_string.encode("utf-8", "surrogateescape"),
        "root_path": root_path,
        "headers": headers,
        "client": client,
        "server": None,
    }
    if state is not None:
        scope["state"] = dict(state)
    return scope


def websocket_scope(
    request: HttpRequest, root_path: str, state: dict[str, Any] | None = None, mount: str = ""
) -> dict[str, Any]:
    """The ASGI ``websocket`` scope of the handshake ``request``: paths, query string, headers and
    client as in its ``http`` scope, the ``ws`` scheme and the subprotocols the client offered."""
    scope = http_scope(request, root_path, state, mount)
    del scope["method"]
    scope["type"] = "websocket"
    scope["asgi"] = _ASGI_WEBSOCKET
    scope["http_version"] = "1.1"
    scope["scheme"] = "ws"
    scope["subprotocols"] = [
        token.strip()
        for name, value in request.headers
        if name.lower() == "sec-websocket-protocol"
        for token in value.split(",")
        if token.strip()
    ]
    scope["extensions"] = {"websocket.http.response": {}}
    return scope


class _Socket:
    """The ASGI side of one WebSocket: the app's messages mapped onto its session."""

    def __init__(self, session: WebSocketSession, request_id: str) -> None:
        self.session = session
        self.request_id = request_id
        self.connected = False  # websocket.connect was received by the app
        self.accepted = False
        self.closed = False  # the app sent websocket.close after accepting
        #: the HTTP answer instead of a socket (close before accept, a denial response)
        self.refusal: HttpResponse | None = None
        self.denial: tuple[int, dict[str, str], list[bytes]] | None = None

    async def receive(self) -> Message:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        return await self.session.receive()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if self.accepted:
            if self.closed:
                raise WebSocketGone("the app closed the WebSocket already")
            if kind == "websocket.send":
                data = message.get("bytes")
                text = message.get("text")
                if data is None and text is None:
                    raise RuntimeError("websocket.send needs 'bytes' or 'text'")
                await self.session.send(bytes(data) if data is not None else str(text))
            elif kind == "websocket.close":
                self.closed = True
                code = message.get("code")
                self.session.close(
                    NORMAL_CLOSURE if code is None else int(code), str(message.get("reason") or "")
                )
            else:
                raise RuntimeError(f"unexpected ASGI message {kind!r} on an open WebSocket")
        elif self.refusal is not None:
            raise WebSocketGone("the WebSocket handshake was refused")
        elif self.denial is not None:
            if kind != "websocket.http.response.body":
                raise RuntimeError(f"expected websocket.http.response.body, got {kind!r}")
            status, headers, body = self.denial
            body.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.refusal = HttpResponse(status, b"".join(body), headers, content_type=None)
        elif kind == "websocket.accept":
            extra = [
                (bytes(name).lower(), bytes(value)) for name, value in message.get("headers") or ()
            ]
            if self.request_id and not any(name == b"x-request-id" for name, _ in extra):
                extra.append((b"x-request-id", self.request_id.encode("latin-1", "replace")))
            self.session.accept(message.get("subprotocol"), extra)
            self.accepted = True
        elif kind == "websocket.close":
            self.refusal = HttpResponse(403, b"", content_type=None)
        elif kind == "websocket.http.response.start":
            headers = {}
            for name, value in message.get("headers", ()):
                key = bytes(name).decode("latin-1").lower()
                if key not in _HOP_HEADERS:
                    headers[key] = bytes(value).decode("latin-1")
            self.denial = (int(message["status"]), headers, [])
        else:
            raise RuntimeError(
                f"expected ASGI message 'websocket.accept', 'websocket.close' or "
                f"'websocket.http.response.start', got {kind!r}"
            )


async def run_websocket(
    app: AsgiApp,
    scope: dict[str, Any],
    session: WebSocketSession,
    request_id: str,
    failed: Callable[[Exception], None] | None = None,
) -> HttpResponse | None:
    """Run ``app`` on one WebSocket handshake for as long as it lasts: None when the app accepted
    it (the socket is closed when this returns), else the HTTP answer to give instead. An app
    failure is logged (and reported to ``failed``): before accepting it answers 500, after it
    closes the socket with 1011."""
    socket = _Socket(session, request_id)
    try:
        await app(scope, socket.receive, socket.send)
    except Exception as exc:
        if isinstance(exc, WebSocketGone):  # the app did not catch the connection ending
            if not socket.accepted:  # nobody left to answer: recorded as the client leaving
                return socket.refusal or HttpResponse(_CLIENT_LEFT, b"", content_type=None)
        else:
            log.error(
                "ASGI app failed on WebSocket %s (request id %s)",
                scope["path"],
                request_id,
                exc_info=exc,
            )
            if failed is not None:
                failed(exc)
            if not socket.accepted:
                return internal_error(request_id)
            session.close(INTERNAL_ERROR, "")
    if socket.accepted:
        if session.state is not SessionState.CLOSED:
            session.close(NORMAL_CLOSURE, "")  # the app returned without closing
        return None
    if socket.refusal is None:
        log.error("ASGI app neither accepted nor refused a WebSocket (request id %s)", request_id)
        return internal_error(request_id)
    return socket.refusal


class _Exchange:
    """One request/response conversation with an ASGI app."""

    def __init__(self, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.body: bytes | None = body
        self.finished = asyncio.Event()  # response complete, or the client left
        self.head: tuple[int, dict[str, str]] | None = None
        #: ("complete", body) for a one-message response, ("stream", b"") for a streamed one,
        #: ("ended", b"") when the app returned or failed before either
        self.first: asyncio.Future[tuple[str, bytes]] = loop.create_future()
        #: the body chunks of a streamed response (made when the response turns out streamed)
        self.chunks: asyncio.Queue[bytes | None] | None = None

    def app_ended(self, _task: asyncio.Task[None]) -> None:
        if not self.first.done():
            self.first.set_result(("ended", b""))

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.finished.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.head is not None:
                raise RuntimeError("the ASGI app sent http.response.start twice")
            headers: dict[str, str] = {}
            for name, value in message.get("headers", ()):
                key = bytes(name).decode("latin-1").lower()
                if key not in _HOP_HEADERS:
                    text = bytes(value).decode("latin-1")
                    headers[key] = f"{headers[key]}, {text}" if key in headers else text
            self.head = (int(message["status"]), headers)
        elif kind == "http.response.body":
            if self.head is None:
                raise RuntimeError("the ASGI app sent a body before http.response.start")
            if self.finished.is_set():
                return  # the client left: drop what is still produced
            data = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if not self.first.done():
                if not more:
                    self.first.set_result(("complete", data))
                    self.finished.set()
                    return
                self.chunks = asyncio.Queue(_STREAM_AHEAD)
                self.first.set_result(("stream", b""))
            chunks = self.chunks
            if chunks is None:  # the app went on after its one-message response had ended
                return
            if data:
                await chunks.put(data)
            if not more:
                await chunks.put(None)

    async def stream(self, task: asyncio.Task[None]) -> AsyncIterator[bytes]:
        """The body chunks as the app sends them; an app failing mid-stream raises here. A
        stream closed before its end (the client left) cancels the app; one that ended lets the
        app finish (Starlette runs background tasks after the body)."""
        ended = False
        chunks = self.chunks
        assert chunks is not None
        try:
            while True:
                getter = asyncio.ensure_future(chunks.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    if chunks.empty():
                        task.result()  # raises the app's exception
                        return  # the app returned without ending its body
                    continue
                chunk = getter.result()
                if chunk is None:
                    ended = True
                    return
                yield chunk
        finally:
            self.finished.set()
            if not ended and not task.done():
                task.cancel()


async def run_asgi(
    app: AsgiApp, scope: dict[str, Any], body: bytes, request_id: str
) -> HttpResponse | StreamingResponse:
    """Run ``app`` on one request: a complete :class:`HttpResponse`, or a
    :class:`~kubeserve.sdk.http.StreamingResponse` whose chunks come as the app sends them.
    An app that fails before its response started gives a 500 naming only the request id."""
    exchange = _Exchange(body)
    task = asyncio.get_running_loop().create_task(app(scope, exchange.receive, exchange.send))
    # One future to wait on (no asyncio.wait): the response's first message, or the app's end.
    task.add_done_callback(exchange.app_ended)
    try:
        kind, data = await exchange.first
    except asyncio.CancelledError:  # the client left before the response began: so does the app
        exchange.finished.set()
        task.cancel()
        raise
    if kind == "ended":
        exchange.finished.set()
        exc = task.exception()
        if exc is not None or exchange.head is None:
            if exc is not None:
                log.error(
                    "ASGI app failed on %s (request id %s)",
                    scope["path"],
                    request_id,
                    exc_info=exc,
                )
            else:
                log.error("ASGI app sent no response (request id %s)", request_id)
            return internal_error(request_id)
        status, headers = exchange.head
        return HttpResponse(status, b"", headers, content_type=None)
    assert exchange.head is not None
    status, headers = exchange.head
    if kind == "complete":
        if not task.done():
            task.add_done_callback(_log_late_failure)
        return HttpResponse(status, data, headers, content_type=None)
    return StreamingResponse(exchange.stream(task), status_code=status, headers=headers)


def _log_late_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("ASGI app failed after its response", exc_info=task.exception())


class Lifespan:
    """The ASGI lifespan protocol of one app: startup before serving, shutdown after draining."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.supported = False
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Run the app's startup; raises :class:`RuntimeError` when it reports a failure."""
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        self._task = asyncio.get_running_loop().create_task(
            self.app(scope, self._to_app.get, self._from_app.put)
        )
        answer = await self._exchange("startup")
        if answer is None:
            return  # the app does not speak lifespan
        self.supported = True
        if answer["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"ASGI lifespan startup failed: {answer.get('message', '')}")

    async def shutdown(self) -> None:
        if not self.supported or self._task is None or self._task.done():
            return
        answer = await self._exchange("shutdown")
        if answer is not None and answer["type"] == "lifespan.shutdown.failed":
            log.error("ASGI lifespan shutdown failed: %s", answer.get("message", ""))

    async def _exchange(self, phase: str) -> Message | None:
        assert self._task is not None
        await self._to_app.put({"type": f"lifespan.{phase}"})
        getter = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        exc = self._task.exception()
        if phase == "startup" and exc is not None:
            log.info("the ASGI app does not support lifespan (%s: %s)", type(exc).__name__, exc)
        elif exc is not None:
            log.error("ASGI lifespan %s failed", phase, exc_info=exc)
        return None


def is_asgi_response(value: Any) -> bool:
    """Whether ``value`` is a Starlette (or FastAPI) response object, sent as it is."""
    for base in type(value).__mro__:
        if base.__module__ == "starlette.responses" and base.__name__ == "Response":
            return True
    return False


def prepare() -> None:
    """Make the Starlette request type now, at start-up, when the application imported Starlette
    (the first request must not pay for it); an application that did not gets
    :class:`_LightRequest` and imports Starlette only if it reads more than that offers."""
    if "starlette.requests" in sys.modules:
        _starlette_request_type()


def _starlette_request_type() -> type | None:
    global _REQUEST_TYPE
    if _REQUEST_TYPE is False:
        try:
            from starlette.requests import Request as StarletteRequest
            from starlette.requests import empty_send
        except ImportError:
            _REQUEST_TYPE = None
        else:

            class IngressRequest(StarletteRequest):
                """A Starlette request that also speaks kubeserve's :class:`Request` surface
                (``path``, ``query_string``) and pickles as one, body included, so it can be
                passed through a handle.

                Built for every request to a plain ingress, most of which never look at it: its
                ASGI scope (a list of encoded headers, the client, the paths) is made on first
                use, not per request."""

                def __init__(self, request: HttpRequest, root_path: str, mount: str) -> None:
                    self._request = request
                    self._root_path = root_path
                    self._mount = mount
                    self._body = request.body  # read already: body(), json(), form(), stream()
                    self._send = empty_send
                    self._stream_consumed = False
                    self._is_disconnected = False
                    self._form = None
                    self._body_received = False

                def __getattr__(self, name: str) -> Any:
                    if name == "scope":
                        scope = self.scope = http_scope(
                            self._request, self._root_path, None, self._mount
                        )
                        return scope
                    raise AttributeError(name)

                async def _receive(self) -> Message:
                    # The body (also in _body) once, then the end of the request.
                    if not self._body_received:
                        self._body_received = True
                        return {"type": "http.request", "body": self._body, "more_body": False}
                    return {"type": "http.disconnect"}

                @property
                def path(self) -> str:
                    return str(self.scope["path"])

                @property
                def query_string(self) -> str:
                    return bytes(self.scope["query_string"]).decode("utf-8", "surrogateescape")

                def __reduce__(self) -> tuple[Any, ...]:
                    headers = [
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]
                    ]
                    body = getattr(self, "_body", b"")
                    return (Request, (self.method, self.path, self.query_string, headers, body))

            _REQUEST_TYPE = IngressRequest
    return _REQUEST_TYPE or None


_REQUEST_TYPE: Any = False
_new = object.__new__


class _LightRequest(Request):
    """What a plain ingress gets while nothing in its process imported Starlette: kubeserve's
    :class:`~kubeserve.sdk.http.Request` (method, path, body, json, stream), which turns into a
    ``starlette.requests.Request`` of the same request the first time the code reads more of it
    (headers, the URL, query parameters, cookies, the client, a form...). A replica whose code
    never looks does not pay Starlette's memory (its import is a tenth of a replica's)."""

    __slots__ = ("_mount", "_root_path", "_source", "_starlette")

    def __init__(self, request: HttpRequest, root_path: str, mount: str) -> None:
        super().__init__(
            request.method, mount + request.path, request.query_string, (), request.body
        )
        self._raw_headers = request.headers
        self._source, self._root_path, self._mount = request, root_path, mount
        self._starlette: Any = None

    def _full(self) -> Any:
        if self._starlette is None:
            request_type = _starlette_request_type()
            if request_type is None:  # Starlette is not installed: kubeserve's surface is all
                return None
            self._starlette = request_type(self._source, self._root_path, self._mount)
        return self._starlette

    @property
    def headers(self) -> Any:
        full = self._full()
        return super().headers if full is None else full.headers

    @property
    def query_params(self) -> Any:
        full = self._full()
        return super().query_params if full is None else full.query_params

    @property
    def url(self) -> Any:
        full = self._full()
        return super().url if full is None else full.url

    def __getattr__(self, name: str) -> Any:
        # only what kubeserve's Request lacks (cookies, client, scope, form, state...)
        full = None if name.startswith("__") or name in _LIGHT_SLOTS else self._full()
        if full is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(full, name)


_LIGHT_SLOTS = frozenset(_LightRequest.__slots__) | frozenset(Request.__slots__)


def user_request(request: HttpRequest, root_path: str, mount: str = "") -> Any:
    """What a plain (non-ASGI) ingress receives: a ``starlette.requests.Request`` (as in Ray)
    once anything in the process imported Starlette (a handler annotated with its ``Request``
    did), else a :class:`_LightRequest` that becomes one when read beyond kubeserve's
    :class:`~kubeserve.sdk.http.Request`."""
    request_type = _REQUEST_TYPE
    if request_type is False:
        if "starlette.requests" not in sys.modules:
            # _LightRequest(request, root_path, mount), without its two __init__ calls
            light: _LightRequest = _new(_LightRequest)
            light.method = request.method.upper()
            light.path = mount + request.path if mount else request.path
            light.query_string = request.query_string
            light._raw_headers = request.headers
            light._body = request.body
            light._headers = light._query = light._starlette = None
            light._source, light._root_path, light._mount = request, root_path, mount
            return light
        request_type = _starlette_request_type()
    if request_type is None:
        return Request(
            request.method,
            mount + request.path,
            request.query_string,
            request.headers,
            request.body,
        )
    return request_type(request, root_path, mount)
