"""The replica's HTTP/1.1 server in-process, over raw sockets and behind the real proxy.

What a client would notice: keep-alive and pipelining in order, chunked and large bodies both ways,
``Expect: 100-continue``, streamed responses (chunked for 1.1, until close for 1.0), a client
leaving mid-stream, handlers that wait, and request isolation of context variables.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aiohttp

from kubeserve.runtime import local_socket
from kubeserve.runtime.channel import Role
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.proxy import ProxyServer
from kubeserve.runtime.replica.http import (
    HttpRequest,
    HttpResponse,
    ReplicaHttpServer,
    StreamedResponse,
)
from kubeserve.runtime.thread_hop import run_sync
from kubeserve.runtime.wire import Snapshot
from support.channel_front import SECRET
from support.common import run
from support.static_source import StaticSource

T = TypeVar("T")
BIG = 5 * 1024 * 1024
_request_tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="")


class App:
    """The handler under test: a few paths, and a record of what was seen."""

    def __init__(self) -> None:
        self.seen: list[HttpRequest] = []
        self.stream_closed = asyncio.Event()
        self.chunks_sent = 0

    async def __call__(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        self.seen.append(request)
        path = request.path
        if path == "/echo":
            headers = {"x-path": request.path, "x-query": request.query_string}
            return HttpResponse(200, request.body, headers, content_type="application/octet-stream")
        if path == "/wait":
            await asyncio.sleep(0.01)  # suspends: the handler leaves the eager path
            return HttpResponse(200, b"waited")
        if path == "/context":
            before = _request_tag.get()
            _request_tag.set(request.query_string)
            await asyncio.sleep(0)
            return HttpResponse(200, f"{before}|{_request_tag.get()}".encode())
        if path == "/stream":
            return StreamedResponse(200, {"content-type": "text/plain"}, self._numbers(3))
        if path == "/endless":
            return StreamedResponse(200, {}, self._endless())
        if path == "/burst":
            return StreamedResponse(200, {}, self._burst())
        if path == "/flood":
            return StreamedResponse(200, {}, self._endless(size=64 * 1024, pause_s=0))
        if path == "/thread-error":
            try:
                await run_sync(_fail_in_a_thread)  # suspends: the handler leaves the eager path
            except ValueError as exc:
                return HttpResponse(200, "".join(traceback.format_exception(exc)).encode())
        if path == "/hops":  # a thread, a bare yield, a thread again: each wait as it comes
            _request_tag.set(request.query_string)
            first = await run_sync(_request_tag.get)
            await asyncio.sleep(0)
            second = await run_sync(_request_tag.get)
            return HttpResponse(
                200, f"{first}|{second}|{asyncio.current_task() is not None}".encode()
            )
        if path == "/headers":
            values = [v for k, v in request.headers if k.lower() == "x-multi"]
            return HttpResponse(200, ",".join(values).encode())
        return HttpResponse(404, b"no such path")

    async def _numbers(self, n: int) -> AsyncIterator[bytes]:
        for i in range(n):
            await asyncio.sleep(0)
            yield b"%d\n" % i

    async def _burst(self) -> AsyncIterator[bytes]:
        """Items yielded without waiting (more bytes than a burst holds), a wait, more."""
        for i in range(100):
            yield b"%d:" % i + b"x" * 1024 + b"\n"
        await asyncio.sleep(0)
        for i in range(3):
            yield b"after %d\n" % i

    async def _endless(self, size: int = 1024, pause_s: float = 0.005) -> AsyncIterator[bytes]:
        try:
            while True:
                await asyncio.sleep(pause_s)
                self.chunks_sent += 1
                yield b"x" * size
        finally:
            self.stream_closed.set()


def _fail_in_a_thread() -> None:
    raise ValueError("from the worker thread")


#: The replica id the servers behind the handshake answer to.
REPLICA_ID = "r"


async def serve(app: App, *, secret: bytes | None = None) -> tuple[asyncio.Server, int]:
    """``app`` on a replica server: plain HTTP, or behind the handshake with ``secret``."""
    handler = ReplicaHttpServer(
        app, control=app if secret else None, secret=secret, identity=REPLICA_ID
    )
    server = await asyncio.get_running_loop().create_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def exchange(port: int, raw: bytes, *, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    data = await reader.read() if until_close else await reader.read(65536)
    writer.close()
    return data


def with_server(test: Callable[[App, int], Awaitable[None]]) -> None:
    async def go() -> None:
        app = App()
        server, port = await serve(app)
        try:
            await test(app, port)
        finally:
            server.close()

    run(go(), uvloop=True)


def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async def check(app: App, port: int) -> None:
        raw = (
            b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
            b"GET /echo?n=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        data = await exchange(port, raw)
        assert data.count(b"HTTP/1.1 200 OK") == 3
        assert data.index(b"waited") < data.index(b"x-query: n=1") < data.index(b"x-query: n=2")
        assert data.count(b"Connection: close") == 1  # only the last answer ends the connection

    with_server(check)


def test_keep_alive_chunked_and_large_bodies() -> None:
    async def check(app: App, port: int) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(
                    f"http://127.0.0.1:{port}/echo?q=%C3%A9", data=b"abc"
                ) as resp:
                    assert (resp.status, await resp.read()) == (200, b"abc")

            async def pieces() -> AsyncIterator[bytes]:
                for i in range(5):
                    yield b"piece%d" % i

            async with session.post(f"http://127.0.0.1:{port}/echo", data=pieces()) as resp:
                assert await resp.read() == b"piece0piece1piece2piece3piece4"
            big = bytes(range(256)) * (BIG // 256)
            async with session.post(f"http://127.0.0.1:{port}/echo", data=big) as resp:
                assert await resp.read() == big
            async with session.get(f"http://127.0.0.1:{port}/stream") as resp:
                assert resp.headers["Transfer-Encoding"] == "chunked"
                assert await resp.read() == b"0\n1\n2\n"
        assert {r.path for r in app.seen} == {"/echo", "/stream"}
        assert app.seen[0].query_string == "q=%C3%A9"  # the raw query, decoded by the user's API

    with_server(check)


def test_answers_carry_their_own_header_values_however_many_differ() -> None:
    """Header lines are encoded once per (name, value) and kept for the next answers: an answer
    never carries another's value, and values that change with every request do not grow the
    kept lines without bound."""
    from kubeserve.runtime.replica import http

    async def check(app: App, port: int) -> None:
        count = http._HEADER_LINES_KEPT + 100
        async with aiohttp.ClientSession() as session:
            for i in range(count):
                async with session.get(f"http://127.0.0.1:{port}/echo?n={i}") as response:
                    assert response.status == 200
                    assert response.headers["x-query"] == f"n={i}"
                    assert response.headers["content-type"] == "application/octet-stream"
        assert len(http._HEADER_LINES) <= http._HEADER_LINES_KEPT

    with_server(check)


def test_expect_100_continue_and_repeated_headers() -> None:
    async def check(app: App, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 4" in head
        assert await reader.readexactly(4) == b"body"
        writer.write(b"GET /headers HTTP/1.1\r\nHost: x\r\nX-Multi: a\r\nx-multi: b\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert await reader.readexactly(3) == b"a,b"
        writer.close()

    with_server(check)


def test_http10_stream_ends_with_the_connection() -> None:
    async def check(app: App, port: int) -> None:
        data = await exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding" not in head and b"Connection: close" in head
        assert body == b"0\n1\n2\n"

    with_server(check)


def test_a_burst_of_items_arrives_whole_and_in_order() -> None:
    async def check(app: App, port: int) -> None:
        data = await exchange(port, b"GET /burst HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head and body.endswith(b"0\r\n\r\n")
        lines = _unchunked(body).splitlines()
        assert lines == [b"%d:" % i + b"x" * 1024 for i in range(100)] + [
            b"after %d" % i for i in range(3)
        ]

    with_server(check)


def _unchunked(body: bytes) -> bytes:
    out, rest = [], body
    while True:
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            return b"".join(out)
        out.append(rest[: int(size, 16)])
        rest = rest[int(size, 16) + 2 :]


def test_client_leaving_mid_stream_stops_the_generator() -> None:
    async def check(app: App, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await reader.read(2048)
        writer.transport.abort()
        await asyncio.wait_for(app.stream_closed.wait(), 5)
        sent = app.chunks_sent
        await asyncio.sleep(0.05)
        assert app.chunks_sent == sent  # nothing produced for a client that left

    with_server(check)


def test_a_client_that_reads_nothing_is_aborted_at_the_send_timeout() -> None:
    async def check(app: App, port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills soon
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        _, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        writer.transport.pause_reading()  # a client that takes nothing
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(app.stream_closed.wait(), 10)  # the generator ends: slot freed
        assert asyncio.get_running_loop().time() - started < 5
        writer.transport.abort()

    with_limits(check)


def test_context_variables_do_not_leak_between_requests() -> None:
    async def check(app: App, port: int) -> None:
        async with aiohttp.ClientSession() as session:
            for tag in ("one", "two"):
                async with session.get(f"http://127.0.0.1:{port}/context?{tag}") as resp:
                    assert await resp.text() == f"|{tag}"

    with_server(check)


def test_an_error_awaited_by_a_suspended_handler_keeps_its_traceback() -> None:
    """A handler that suspended (no longer run eagerly) gets a failed future's exception with
    the frames where it was raised (here a worker thread's), as a task would give it: the
    replica's remote tracebacks show the user's frames from them."""

    async def check(app: App, port: int) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/thread-error") as resp,
        ):
            text = await resp.text()
        assert "in _fail_in_a_thread\n" in text and "in _worker\n" in text, text

    with_server(check)


def test_a_handler_waiting_on_threads_and_the_loop_in_turn_is_served_in_its_context() -> None:
    """A handler waiting on a worker thread is stepped on by the thread hop itself (no task);
    a wait of another kind after it (here a bare yield) goes on in a task, and the request's
    context variables follow it through every wait, pipelined requests in their turn."""

    async def check(app: App, port: int) -> None:
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(
                *(_get(session, f"http://127.0.0.1:{port}/hops?{i}") for i in range(20))
            )
        assert answers == [b"%d|%d|True" % (i, i) for i in range(20)]
        requests = b"".join(b"GET /hops?p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3))
        data = await exchange(port, requests + b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert data.count(b"HTTP/1.1 200 OK") == 4
        assert data.index(b"p0|p0|True") < data.index(b"p1|p1|True") < data.index(b"p2|p2|True")

    with_server(check)


def test_malformed_request_gets_400_and_close() -> None:
    async def check(app: App, port: int) -> None:
        data = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 400 Bad Request")
        assert b"Connection: close" in data

    with_server(check)


def test_idle_connections_close_after_the_keep_alive_timeout() -> None:
    async def go() -> None:
        server = await asyncio.get_running_loop().create_server(
            ReplicaHttpServer(App(), keep_alive_timeout_s=0.1), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            writer.close()
        finally:
            server.close()

    run(go(), uvloop=True)


SMALL = RequestLimits(
    header_timeout_s=0.3,
    body_timeout_s=0.3,
    send_timeout_s=0.5,
    max_url_bytes=100,
    max_header_bytes=1000,
    max_body_bytes=1000,
)


def with_limits(test: Callable[[App, int], Awaitable[None]]) -> None:
    async def go() -> None:
        app = App()
        handler = ReplicaHttpServer(app, limits=SMALL)
        server = await asyncio.get_running_loop().create_server(handler, "127.0.0.1", 0)
        try:
            await test(app, server.sockets[0].getsockname()[1])
        finally:
            server.close()

    run(go(), uvloop=True)


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def test_oversized_urls_heads_and_bodies_are_refused_before_user_code() -> None:
    async def check(app: App, port: int) -> None:
        long_url = b"GET /echo?" + b"q" * 200 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        assert status_of(await exchange(port, long_url)) == 414
        big_head = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 2000 + b"\r\n\r\n"
        assert status_of(await exchange(port, big_head)) == 431
        # A head that never ends: cut off once past the limit, not buffered forever.
        endless = b"GET /echo HTTP/1.1\r\nX-Endless: " + b"e" * 4000
        data = await exchange(port, endless)
        assert status_of(data) == 431 and b"Connection: close" in data
        # A declared body over the cap: refused on the head alone, before the body is sent.
        declared = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
        assert status_of(await exchange(port, declared)) == 413
        chunk = b"258\r\n" + b"c" * 600 + b"\r\n"
        chunked = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert status_of(await exchange(port, chunked + chunk * 3 + b"0\r\n\r\n")) == 413
        assert app.seen == []
        ok = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"k" * 1000
        data = await exchange(port, ok + b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert status_of(data) == 200 and b"k" * 1000 in data

    with_limits(check)


def test_stalled_heads_and_bodies_get_408_and_close() -> None:
    async def check(app: App, port: int) -> None:
        for stalled in (
            b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: a",  # slowloris: the head never ends
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhalf",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(stalled)
            data = await asyncio.wait_for(reader.read(), 10)  # ends: the server closed it
            writer.close()
            assert status_of(data) == 408, data
            assert b"x-request-id: " in data
        assert app.seen == []

    with_limits(check)


def test_user_code_sees_the_normalised_path_and_the_request_id() -> None:
    async def check(app: App, port: int) -> None:
        data = await exchange(
            port,
            b"GET /x/..//%65cho?q=1 HTTP/1.1\r\nX-Request-Id: rid-7\r\nConnection: close\r\n\r\n",
        )
        assert status_of(data) == 200, data
        assert b"x-path: /echo" in data and b"x-request-id: rid-7" in data
        assert app.seen[0].path == "/echo" and app.seen[0].request_id == "rid-7"

    with_server(check)


def test_behind_the_proxy_streams_and_large_bodies_pass() -> None:
    async def go() -> None:
        app = App()
        server, port = await serve(app, secret=SECRET)
        proxy = await proxy_in_front_of(port)
        base = f"http://127.0.0.1:{proxy.port}"
        try:
            async with aiohttp.ClientSession() as session:
                big = b"k" * BIG
                async with session.post(f"{base}/echo", data=big) as resp:
                    assert await resp.read() == big
                async with session.get(f"{base}/stream") as resp:
                    assert await resp.read() == b"0\n1\n2\n"
                results = await asyncio.gather(*(_get(session, f"{base}/wait") for _ in range(20)))
                assert results == [b"waited"] * 20
        finally:
            await proxy.close()
            server.close()

    run(go(), uvloop=True)


async def _get(session: aiohttp.ClientSession, url: str) -> bytes:
    async with session.get(url) as resp:
        return await resp.read()


def test_same_host_unix_socket_is_preferred_and_tcp_is_the_fallback() -> None:
    async def go() -> None:
        app = App()
        replica_server = ReplicaHttpServer(app, control=app, secret=SECRET, identity=REPLICA_ID)
        tcp = await asyncio.get_running_loop().create_server(replica_server, "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
        # Only a loopback target has a socket name; nothing listens on it yet: TCP it is.
        assert local_socket.socket_name("10.0.0.7", port) is None
        assert await local_socket.connect(asyncio.Protocol, "127.0.0.1", port) is None
        unix = await local_socket.listen(replica_server, "127.0.0.1", port)
        assert unix is not None
        assert await local_socket.listen(replica_server, "127.0.0.1", port) is None  # taken

        families: list[int] = []

        async def answer(request: HttpRequest) -> HttpResponse | StreamedResponse:
            families.extend(
                c.transport.get_extra_info("socket").family for c in replica_server.connections
            )
            return await app(request)

        replica_server.handlers[Role.INGRESS] = answer
        proxy = await proxy_in_front_of(port)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    assert await _get(session, f"http://127.0.0.1:{proxy.port}/wait") == b"waited"
            assert families and set(families) == {socket.AF_UNIX}
        finally:
            await proxy.close()
            unix.close()
            tcp.close()

    run(go(), uvloop=True)


async def proxy_in_front_of(port: int) -> ProxyServer:
    """A started proxy routing ``/`` to the one replica on ``127.0.0.1:port``."""
    snapshot: Snapshot = {
        "version": 1,
        "routes": [{"route_prefix": "/", "app": "a", "deployment": "D"}],
        "deployments": {
            "a#D": {
                "max_ongoing_requests": 8,
                "replicas": [{"replica_id": REPLICA_ID, "host": "127.0.0.1", "port": port}],
            }
        },
    }
    source = StaticSource(snapshot)
    proxy = ProxyServer("127.0.0.1", 0, source=source, secret=SECRET)
    await proxy.start()
    return proxy
