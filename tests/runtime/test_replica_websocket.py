"""WebSockets on the replica's HTTP server in-process: the ASGI ``websocket`` scope and messages
(:mod:`kubeserve.runtime.replica.asgi`) over the wsproto-framed session
(:mod:`kubeserve.runtime.websocket`), seen by raw sockets, a wsproto client and aiohttp."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection, ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)

from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.replica.asgi import run_websocket, websocket_scope
from kubeserve.runtime.replica.http import HttpRequest, HttpResponse, ReplicaHttpServer
from kubeserve.runtime.websocket import WebSocketSession
from support.common import run, wait_until

LIMIT = 4096
Message = dict[str, Any]


async def _plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"plain " + request.path.encode())


async def serve(
    app: Any, *, root_path: str = "", websocket: bool = True, ping_interval_s: float | None = None
) -> tuple[ReplicaHttpServer, asyncio.Server, int]:
    """``app`` as a replica's ingress serves WebSockets (``websocket``) on a fresh port."""

    async def handler(request: HttpRequest, session: WebSocketSession) -> HttpResponse | None:
        scope = websocket_scope(request, root_path)
        return await run_websocket(app, scope, session, request.request_id)

    server = ReplicaHttpServer(
        _plain,
        websocket=handler if websocket else None,
        limits=RequestLimits(max_body_bytes=LIMIT),
        websocket_ping_interval_s=ping_interval_s,
    )
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    return server, listener, listener.sockets[0].getsockname()[1]


def with_app(
    app: Any, test: Callable[[int, ReplicaHttpServer], Awaitable[None]], **options: Any
) -> None:
    async def go() -> None:
        server, listener, port = await serve(app, **options)
        try:
            await test(port, server)
        finally:
            listener.close()
            server.close_all()

    run(go(), uvloop=True)


class RawClient:
    """A WebSocket client on a raw socket, framed by wsproto: sees every frame and answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Event] = []
        self.raw = b""

    @classmethod
    async def open(cls, port: int, target: str = "/ws", **request: Any) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        writer.write(client.ws.send(Request(host="x", target=target, **request)))
        return client

    def send(self, event: Event) -> None:
        self.writer.write(self.ws.send(event))

    async def next(self, kind: type[Event] = Event) -> Event:
        """The next event of ``kind`` (reading as needed); EOF fails."""
        while True:
            while self.events:
                event = self.events.pop(0)
                if isinstance(event, kind):
                    return event
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            assert data, f"connection closed before a {kind.__name__}"
            self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Frame what arrived; a close frame from the server is answered, as clients do."""
        self.raw += data
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            self.events.append(event)
            if (
                isinstance(event, CloseConnection)
                and self.ws.state is ConnectionState.REMOTE_CLOSING
            ):
                self.writer.write(self.ws.send(event.response()))

    async def closed(self) -> bool:
        """Whether the server closes the connection (reads what is left)."""
        while data := await asyncio.wait_for(self.reader.read(65536), 10):
            self._receive(data)
        self._receive(b"")
        return True

    def close(self) -> None:
        self.writer.close()


async def raw_answer(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


# -- the scope and the handshake -----------------------------------------------------------------


class Recorder:
    """A raw ASGI app: records its scope and messages, then plays ``script``."""

    def __init__(self, script: Callable[[Any, Any], Awaitable[None]] | None = None) -> None:
        self.scope: dict[str, Any] = {}
        self.received: list[Message] = []
        self.done = asyncio.Event()
        self.error: BaseException | None = None
        self.script = script

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope

        async def recording_receive() -> Message:
            message: Message = await receive()
            self.received.append(message)
            return message

        try:
            if self.script is not None:
                await self.script(recording_receive, send)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.done.set()


def test_the_websocket_scope_is_the_http_one_with_ws_and_subprotocols() -> None:
    async def script(receive: Any, send: Any) -> None:
        assert await receive() == {"type": "websocket.connect"}
        await send({"type": "websocket.accept", "subprotocol": "b", "headers": [(b"x-a", b"1")]})
        await send({"type": "websocket.close"})

    app = Recorder(script)

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(
            port,
            "/pre/x%20y/../z?q=1&r=%C3%A9",
            subprotocols=["a", "b"],
            extra_headers=[(b"x-forwarded-for", b"10.0.0.1, 10.0.0.2")],
        )
        accept = await client.next(AcceptConnection)
        assert isinstance(accept, AcceptConnection)
        assert accept.subprotocol == "b" and (b"x-a", b"1") in accept.extra_headers
        assert any(name == b"x-request-id" for name, _ in accept.extra_headers)
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1000
        client.close()

    with_app(app, test, root_path="/pre")
    scope = app.scope
    assert scope["type"] == "websocket"
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert (scope["scheme"], scope["http_version"]) == ("ws", "1.1")
    assert (scope["path"], scope["root_path"]) == ("/pre/z", "/pre")  # normalised, as for http
    assert scope["raw_path"] == b"/pre/z"
    assert scope["query_string"] == b"q=1&r=%C3%A9"
    assert scope["subprotocols"] == ["a", "b"]
    assert scope["client"] == ("10.0.0.1", 0)
    assert (b"sec-websocket-version", b"13") in scope["headers"]
    assert "method" not in scope
    assert "websocket.http.response" in scope["extensions"]


def test_handshakes_that_are_no_websocket_ones_get_plain_answers() -> None:
    async def test(port: int, server: ReplicaHttpServer) -> None:
        head = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        answer = await raw_answer(port, head + b"Sec-WebSocket-Version: 13\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ") and b"Sec-WebSocket-Key" in answer, answer
        answer = await raw_answer(
            port, b"GET /h HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 501 ") and b"upgrading to h2c" in answer, answer
        # An Upgrade header without Connection: Upgrade is an ordinary request.
        answer = await raw_answer(
            port, b"GET /p HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"plain /p"), answer

    with_app(Recorder(), test)


def test_a_server_without_a_websocket_handler_answers_501() -> None:
    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        refusal = await client.next(RejectConnection)
        assert isinstance(refusal, RejectConnection) and refusal.status_code == 501

    with_app(Recorder(), test, websocket=False)


def test_closing_before_accepting_is_a_403_and_a_denial_response_is_sent_as_is() -> None:
    async def close_at_once(receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.close", "code": 1008})

    async def deny(receive: Any, send: Any) -> None:
        await receive()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": b"who ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"are you?"})

    async def first(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        refusal = await client.next(RejectConnection)
        assert isinstance(refusal, RejectConnection) and refusal.status_code == 403
        assert await client.closed()

    async def second(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.closed()
        head, _, body = client.raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401 ") and b"www-authenticate: Bearer" in head
        assert b"Connection: close" in head and body == b"who are you?"

    with_app(Recorder(close_at_once), first)
    with_app(Recorder(deny), second)


def test_an_app_failing_before_accepting_gives_500_and_after_it_closes_1011() -> None:
    async def fail_early(receive: Any, send: Any) -> None:
        raise ValueError("boom")

    async def fail_late(receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        raise ValueError("boom")

    async def never_answer(receive: Any, send: Any) -> None:
        await receive()

    async def refused(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        refusal = await client.next(RejectConnection)
        assert isinstance(refusal, RejectConnection) and refusal.status_code == 500

    async def closed_1011(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1011

    with_app(Recorder(fail_early), refused)
    with_app(Recorder(never_answer), refused)
    with_app(Recorder(fail_late), closed_1011)


# -- messages ------------------------------------------------------------------------------------


class Echo:
    """A raw ASGI echo that records the disconnect it receives and what ``send`` raised."""

    def __init__(self) -> None:
        self.disconnect: Message | None = None
        self.send_error: BaseException | None = None
        self.done = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    self.disconnect = message
                    try:
                        await send({"type": "websocket.send", "text": "too late"})
                    except OSError as exc:
                        self.send_error = exc
                    return
                if message.get("text") == "close":
                    await send({"type": "websocket.close", "code": 4000, "reason": "asked to"})
                    continue
                reply = {k: v for k, v in message.items() if k in ("text", "bytes")}
                await send({"type": "websocket.send", **reply})
        finally:
            self.done.set()


def test_fragments_are_one_message_and_pings_are_answered() -> None:
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        for piece, last in (("frag", False), ("men", False), ("ted", True)):
            client.send(TextMessage(data=piece, message_finished=last))
        echoed = await client.next(TextMessage)
        assert isinstance(echoed, TextMessage) and echoed.data == "fragmented"
        client.send(BytesMessage(data=b"\x00" * 10, message_finished=False))
        client.send(BytesMessage(data=b"\xff" * 10))
        blob = await client.next(BytesMessage)
        assert isinstance(blob, BytesMessage) and blob.data == b"\x00" * 10 + b"\xff" * 10
        client.send(Ping(payload=b"are you there"))
        pong = await client.next(Pong)
        assert isinstance(pong, Pong) and pong.payload == b"are you there"
        client.send(TextMessage(data="close"))
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection)
        assert (closing.code, closing.reason) == (4000, "asked to")
        assert await client.closed()
        await asyncio.wait_for(app.done.wait(), 5)
        assert app.disconnect is not None and app.disconnect["code"] == 4000

    with_app(app, test)


def test_frames_behind_the_handshake_wait_for_the_accept() -> None:
    async def slow_accept(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(0.2)
        await send({"type": "websocket.accept"})
        message = await receive()
        await send({"type": "websocket.send", "text": "got " + message["text"]})

    async def test(port: int, server: ReplicaHttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = RawClient(reader, writer)
        handshake = client.ws.send(Request(host="x", target="/ws"))
        early = Connection(ConnectionType.CLIENT).send(TextMessage(data="early"))
        writer.write(handshake + early)
        reply = await client.next(TextMessage)
        assert isinstance(reply, TextMessage) and reply.data == "got early"
        client.close()

    with_app(slow_accept, test)


def test_a_message_over_the_limit_closes_1009_even_in_fragments() -> None:
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        client.send(TextMessage(data="é" * (LIMIT // 2)))  # LIMIT bytes of UTF-8: fine
        echoed = await client.next(TextMessage)
        assert isinstance(echoed, TextMessage) and len(echoed.data) == LIMIT // 2
        client.send(BytesMessage(data=b"x" * (LIMIT // 2), message_finished=False))
        client.send(BytesMessage(data=b"x" * (LIMIT // 2 + 1)))
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1009
        assert await client.closed()
        await asyncio.wait_for(app.done.wait(), 5)
        assert app.disconnect is not None and app.disconnect["code"] == 1009

    with_app(app, test)


def test_a_message_far_over_the_limit_still_gets_its_1009() -> None:
    """The client is still sending when the server closes: the close frame must reach it anyway
    (closing with unread bytes would reset the connection and drop it)."""
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        client.send(BytesMessage(data=b"x" * (LIMIT * 2048)))  # 8 MiB, streaming in
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1009
        assert await client.closed()  # answered: the connection was still there to take it
        await asyncio.wait_for(app.done.wait(), 5)
        assert app.disconnect is not None and app.disconnect["code"] == 1009

    with_app(app, test)


def test_a_client_vanishing_is_1006_and_sending_then_raises_oserror() -> None:
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        client.writer.transport.abort()
        await asyncio.wait_for(app.done.wait(), 5)
        assert app.disconnect is not None and app.disconnect["code"] == 1006
        assert isinstance(app.send_error, OSError)
        await wait_until(lambda: not server.connections)

    with_app(app, test)


def test_stopping_the_server_closes_open_sockets_with_1001() -> None:
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        server.close_all()
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1001
        await asyncio.wait_for(app.done.wait(), 5)
        assert app.disconnect is not None and app.disconnect["code"] == 1001

    with_app(app, test)


def test_a_handshake_pipelined_behind_requests_is_served_after_them() -> None:
    async def test(port: int, server: ReplicaHttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = RawClient(reader, writer)
        handshake = client.ws.send(Request(host="x", target="/ws"))
        writer.write(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n" + handshake)
        head = await asyncio.wait_for(reader.readuntil(b"plain /one"), 10)
        assert head.startswith(b"HTTP/1.1 200 ")
        await client.next(AcceptConnection)
        client.send(TextMessage(data="after"))
        echoed = await client.next(TextMessage)
        assert isinstance(echoed, TextMessage) and echoed.data == "after"
        client.close()

    with_app(Echo(), test)


# -- FastAPI, through aiohttp --------------------------------------------------------------------


def test_a_fastapi_app_speaks_through_aiohttp() -> None:
    api = FastAPI()
    left: list[int] = []

    @api.websocket("/rooms/{room}")
    async def room(ws: WebSocket, room: str) -> None:
        await ws.accept(subprotocol="chat" if "chat" in ws.scope["subprotocols"] else None)
        try:
            while True:
                text = await ws.receive_text()
                await ws.send_text(f"{room}: {text}")
        except WebSocketDisconnect as exc:
            left.append(exc.code)

    async def test(port: int, server: ReplicaHttpServer) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"http://127.0.0.1:{port}/api/rooms/blue", protocols=("x", "chat"), autoping=True
            ) as ws,
        ):
            assert ws.protocol == "chat"
            await ws.send_str("hi")
            assert await ws.receive_str() == "blue: hi"
            await ws.ping()
            await ws.send_str("again")
            assert await ws.receive_str() == "blue: again"
        await wait_until(lambda: left == [1000])
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(f"http://127.0.0.1:{port}/api/nowhere")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 403  # Starlette's router closes unknown websocket routes
            else:
                raise AssertionError("an unknown route was accepted")

    with_app(api, test, root_path="/api")


def test_a_client_leaving_before_the_accept_ends_the_app_quietly() -> None:
    errors: list[BaseException] = []
    done = asyncio.Event()

    async def slow_accept(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(0.2)
        try:
            await send({"type": "websocket.accept"})
        except OSError as exc:  # the ASGI spec's error for a connection that is gone
            errors.append(exc)
        finally:
            done.set()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        client = await RawClient.open(port)
        await asyncio.sleep(0.05)
        client.writer.transport.abort()
        await asyncio.wait_for(done.wait(), 5)
        assert len(errors) == 1
        await wait_until(lambda: not server.connections)

    with_app(slow_accept, test)


def test_a_silent_client_is_pinged_then_closed_and_a_live_one_stays() -> None:
    app = Echo()

    async def test(port: int, server: ReplicaHttpServer) -> None:
        # aiohttp answers pings while it reads: the socket outlives many ping periods.
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"http://127.0.0.1:{port}/ws", autoping=True) as ws,
        ):
            received: list[Any] = []

            async def read() -> None:
                async for message in ws:
                    received.append(message.data)

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.6)
            assert not received and not ws.closed
            await ws.send_str("still here")
            await wait_until(lambda: received == ["still here"])
            await ws.close()
            await reader
        # A client that answers nothing: pinged, then closed with 1011 a period later.
        client = await RawClient.open(port)
        await client.next(AcceptConnection)
        ping = await client.next(Ping)
        assert isinstance(ping, Ping)
        closing = await client.next(CloseConnection)
        assert isinstance(closing, CloseConnection) and closing.code == 1011
        assert await client.closed()
        await wait_until(lambda: app.disconnect is not None and app.disconnect["code"] == 1011)

    with_app(app, test, ping_interval_s=0.1)
