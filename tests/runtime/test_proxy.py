"""The HTTP proxy end to end: a real proxy, a stand-in controller and real replica HTTP servers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.proxy import ProxyServer
from kubeserve.runtime.proxy.exchange import BUFFER_BEFORE_SLOT
from kubeserve.runtime.proxy.server import LeavePlan
from kubeserve.runtime.wire import UNSERVED_HEADER, DeploymentEndpoints, Route, Snapshot
from support.channel_front import SECRET, ChannelFront, signed_ok
from support.common import run, wait_until

T = TypeVar("T")
BIG = 5 * 1024 * 1024


class FakeReplica:
    """An aiohttp server standing in for a replica; records what it saw."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.ongoing = 0
        self.peak = 0
        self.peers: list[Any] = []
        self.hits: Counter[str] = Counter()  # requests that reached this replica, by path
        self.shutting_down = False  # answer as a draining replica does: 503, never started
        self.release = asyncio.Event()
        self.sockets_closed = 0  # WebSockets whose handler saw the end
        self.streams_ended = 0  # endless streams whose handler saw the end
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        # Replicas take authenticated connections only: the proxy reaches this one through the
        # real handshake in front of it.
        self.front = ChannelFront(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.port = await self.front.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.front.stop()
            await self.runner.cleanup()
            self.runner = None

    def endpoint(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "host": "127.0.0.1", "port": self.port}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits[request.path] += 1
        if self.shutting_down:
            await request.read()
            headers = {UNSERVED_HEADER: "shutting-down", "Connection": "close"}
            return web.Response(status=503, text="replica is shutting down", headers=headers)
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        self.ongoing += 1
        self.peak = max(self.peak, self.ongoing)
        try:
            return await self.dispatch(request)
        finally:
            self.ongoing -= 1

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        tail = request.path.rsplit("/", 1)[-1]
        headers = {"X-Replica": self.replica_id}
        if tail == "ws":  # a WebSocket echo; "close" makes the replica close it with 4002
            ws = web.WebSocketResponse(max_msg_size=0, autoping=True)
            ws.headers["X-Replica"] = self.replica_id
            await ws.prepare(request)
            try:
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        if message.data == "close":
                            await ws.close(code=4002, message=b"replica says bye")
                            break
                        await ws.send_str(message.data)
                    elif message.type == aiohttp.WSMsgType.BINARY:
                        await ws.send_bytes(message.data)
            finally:
                self.sockets_closed += 1
            return ws
        if tail == "echo":  # streams the body back as it arrives, chunked
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            async for piece in request.content.iter_any():
                await resp.write(piece)
            await resp.write_eof()
            return resp
        if tail == "size":
            body = await request.read()
            return web.json_response({"size": len(body)}, headers=headers)
        if tail == "big":
            return web.Response(body=b"x" * BIG, headers=headers)
        if tail == "endless":  # streams until the client leaves
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            try:
                while True:
                    await resp.write(b"e" * 65536)
            finally:
                self.streams_ended += 1
        if tail == "chunks":
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(5):
                await resp.write(b"chunk%d;" % i)
            await resp.write_eof()
            return resp
        if tail == "cookies":
            resp = web.Response(text="ok", headers=headers)
            resp.headers.add("Set-Cookie", "a=1")
            resp.headers.add("Set-Cookie", "b=2")
            return resp
        if tail == "hop":  # hop-by-hop headers the proxy must not pass on
            return web.Response(
                text="hop", headers={**headers, "Keep-Alive": "timeout=5", "Proxy-Connection": "x"}
            )
        if tail == "slow":
            await self.release.wait()
            return web.Response(text="slow done", headers=headers)
        if tail == "die-before":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(10)
        if tail == "die-mid":
            resp = web.StreamResponse(headers=headers)
            resp.content_length = 1000
            await resp.prepare(request)
            await resp.write(b"partial")
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(10)
        return web.json_response(
            {
                "replica": self.replica_id,
                "path": request.path_qs,
                "host": request.headers.get("Host"),
                "x_multi": request.headers.getall("X-Multi", []),
                "request_id": request.headers.getall("X-Request-Id", []),
                "headers": sorted(name.lower() for name in request.headers),
            },
            headers=headers,
        )


class FakeController:
    """Serves ``/-/snapshot`` long-polls from a snapshot the test sets."""

    def __init__(self) -> None:
        self.snapshot: Snapshot = {"version": 0, "routes": [], "deployments": {}}
        self.changed = asyncio.Condition()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/-/snapshot", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def set(self, routes: list[Route], deployments: dict[str, DeploymentEndpoints]) -> None:
        async with self.changed:
            version = self.snapshot["version"] + 1
            self.snapshot = {"version": version, "routes": routes, "deployments": deployments}
            self.changed.notify_all()

    async def handle(self, request: web.Request) -> web.Response:
        if not signed_ok(request.headers, request.rel_url.raw_path_qs):
            return web.json_response({"error": "unsigned"}, status=403)
        version = int(request.query["version"])
        timeout = float(request.query["timeout"])
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: self.snapshot["version"] != version), timeout
                )
            return web.json_response(self.snapshot)


class Cluster:
    def __init__(
        self, proxy: ProxyServer, controller: FakeController, replicas: dict[str, FakeReplica]
    ):
        self.proxy = proxy
        self.controller = controller
        self.replicas = replicas
        self.url = f"http://127.0.0.1:{proxy.port}"

    def in_flight(self) -> int:
        router = self.proxy.state.router
        return sum(sum(router.in_flight(k).values()) for k in ("app#A", "app#AB"))


@contextlib.asynccontextmanager
async def cluster(
    *,
    a_replicas: int = 1,
    cap: int = 100,
    request_timeout_s: float | None = None,
    limits: RequestLimits | None = None,
) -> AsyncIterator[Cluster]:
    controller = FakeController()
    await controller.start()
    replicas = {f"a{i}": FakeReplica(f"a{i}") for i in range(a_replicas)}
    replicas["ab0"] = FakeReplica("ab0")
    for replica in replicas.values():
        await replica.start()
    await controller.set(
        [
            {"route_prefix": "/a", "app": "app", "deployment": "A"},
            {"route_prefix": "/a/b", "app": "app", "deployment": "AB"},
            {"route_prefix": "/empty", "app": "other", "deployment": "E"},
        ],
        {
            "app#A": {
                "max_ongoing_requests": cap,
                "replicas": [
                    r.endpoint() for k, r in replicas.items() if k.startswith("a") and k != "ab0"
                ],  # type: ignore[misc]
            },
            "app#AB": {"max_ongoing_requests": cap, "replicas": [replicas["ab0"].endpoint()]},  # type: ignore[list-item]
            "other#E": {"max_ongoing_requests": cap, "replicas": []},
        },
    )
    proxy = ProxyServer(
        "127.0.0.1",
        0,
        controller.url,
        secret=SECRET,
        request_timeout_s=request_timeout_s,
        limits=limits,
    )
    await proxy.start()
    try:
        yield Cluster(proxy, controller, replicas)
    finally:
        for replica in replicas.values():
            replica.release.set()
        await proxy.close()
        for replica in replicas.values():
            await replica.stop()
        await controller.stop()


def scenario(
    body: Callable[[Cluster, aiohttp.ClientSession], Awaitable[None]], **options: Any
) -> None:
    async def go() -> None:
        async with cluster(**options) as c, aiohttp.ClientSession() as session:
            await body(c, session)

    run(go(), uvloop=True)


async def raw_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> tuple[bytes, bytes]:
    """Send one request on a raw connection, read one response (Content-Length framed)."""
    writer.write(req)
    return await read_response(reader)


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One Content-Length framed response from a raw connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def test_longest_prefix_routing() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        for path, replica in [
            ("/a", "a0"),
            ("/a/", "a0"),
            ("/a/c?x=1", "a0"),
            ("/a/b", "ab0"),
            ("/a/b/", "ab0"),
            ("/a/b/c", "ab0"),
        ]:
            async with s.get(c.url + path) as resp:
                assert resp.status == 200, path
                data = await resp.json()
                assert data["replica"] == replica, path
                assert data["path"] == path
                assert data["host"] == f"127.0.0.1:{c.proxy.port}"  # Host passes unchanged
        async with s.get(c.url + "/ab") as resp:
            assert resp.status == 404
            assert "/ab" in await resp.text()

    scenario(body)


def test_healthz_and_routes() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.get(c.url + "/-/healthz") as resp:
            assert resp.status == 200 and await resp.text() == "success"
        async with s.get(c.url + "/-/routes") as resp:
            assert await resp.json() == {"/a": "app", "/a/b": "app", "/empty": "other"}
        for internal in ("/-/metrics", "/-/call/x", "/-/reconfigure"):
            async with s.post(c.url + internal, data=b"x") as resp:
                assert resp.status == 404, internal

    scenario(body)


def test_healthz_503_before_first_snapshot() -> None:
    class Silent:
        async def start(self, on_update: Any) -> None:
            pass

        async def close(self) -> None:
            pass

    async def go() -> None:
        proxy = ProxyServer("127.0.0.1", 0, source=Silent(), secret=SECRET)
        await proxy.start()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{proxy.port}/-/healthz") as resp:
                    assert resp.status == 503
                async with s.get(f"http://127.0.0.1:{proxy.port}/x") as resp:
                    assert resp.status == 503  # a route it may not know yet: never a 404
                    assert resp.headers["Retry-After"] == "1"
                proxy.state.apply({"version": 1, "routes": [], "deployments": {}})
                async with s.get(f"http://127.0.0.1:{proxy.port}/-/healthz") as resp:
                    assert resp.status == 200
                async with s.get(f"http://127.0.0.1:{proxy.port}/x") as resp:
                    assert resp.status == 404
        finally:
            await proxy.close()

    run(go(), uvloop=True)


def test_on_an_inherited_socket_connections_wait_for_the_first_snapshot() -> None:
    """A proxy started on a listening socket it inherits (``kubeserve start`` keeps it across
    proxy restarts) accepts only once its routes arrived: a connection made before is held in the
    backlog and answered after them."""

    class Late:
        def __init__(self) -> None:
            self.release = asyncio.Event()

        async def start(self, on_update: Callable[[Snapshot], None]) -> None:
            await self.release.wait()
            on_update({"version": 1, "routes": [], "deployments": {}})

        async def close(self) -> None:
            pass

    async def go() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        source = Late()
        proxy = ProxyServer(
            "127.0.0.1", port, source=source, secret=SECRET, listen_fd=listener.detach()
        )
        starting = asyncio.ensure_future(proxy.start())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the backlog
            writer.write(b"GET /-/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            source.release.set()
            await starting
            assert (await reader.read()).startswith(b"HTTP/1.1 200 ")  # after the snapshot
            writer.close()
        finally:
            await proxy.close()

    run(go(), uvloop=True)


def test_chunked_bodies_both_ways() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async def gen() -> AsyncIterator[bytes]:
            for i in range(10):
                yield b"piece%d;" % i

        async with s.post(c.url + "/a/echo", data=gen()) as resp:
            assert resp.status == 200
            assert resp.headers.get("Transfer-Encoding") == "chunked"
            assert await resp.read() == b"".join(b"piece%d;" % i for i in range(10))
        async with s.get(c.url + "/a/chunks") as resp:
            assert await resp.read() == b"chunk0;chunk1;chunk2;chunk3;chunk4;"

    scenario(body)


def test_five_megabytes_both_ways() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        payload = os.urandom(BIG)
        async with s.post(c.url + "/a/echo", data=payload) as resp:
            assert await resp.read() == payload
        async with s.post(c.url + "/a/size", data=payload) as resp:
            assert (await resp.json())["size"] == BIG
        async with s.get(c.url + "/a/big") as resp:
            assert len(await resp.read()) == BIG

    scenario(body)


def test_keep_alive_reuses_client_and_upstream_connections() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            for _ in range(5):
                head, payload = await raw_request(
                    reader, writer, b"GET /a/x HTTP/1.1\r\nHost: example.test\r\n\r\n"
                )
                assert head.startswith(b"HTTP/1.1 200")
                assert b'"host": "example.test"' in payload
        finally:
            writer.close()
        # five requests, one client connection, one upstream connection
        assert len(set(c.replicas["a0"].peers)) == 1

    scenario(body)


def test_a_leaving_proxy_serves_on_then_closes_keep_alive_connections_gracefully() -> None:
    """``leave``: during its delay a request is answered as usual; then no connection is
    accepted, a request on a kept-alive connection and the one in flight are answered (whole)
    with ``Connection: close``, and an idle connection is closed, all within the drain."""
    get = b"GET /a/x HTTP/1.1\r\nHost: example.test\r\n\r\n"

    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        port = c.proxy.port
        busy = await asyncio.open_connection("127.0.0.1", port)
        idle = await asyncio.open_connection("127.0.0.1", port)
        slow = await asyncio.open_connection("127.0.0.1", port)
        try:
            for reader, writer in (busy, idle):
                head, _ = await raw_request(reader, writer, get)
                assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
            slow[1].write(b"GET /a/slow HTTP/1.1\r\nHost: example.test\r\n\r\n")
            await wait_until(lambda: c.in_flight() == 1)
            plan = LeavePlan(delay_s=0.5, drain_s=10)
            leaving = asyncio.create_task(c.proxy.leave(plan))
            head, _ = await raw_request(*busy, get)  # within the delay: served as before
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
            await wait_until(lambda: c.proxy.state.leaving, 5)
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", port)
            head, payload = await raw_request(*busy, get)
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, head
            assert b'"host": "example.test"' in payload
            assert await asyncio.wait_for(busy[0].read(), 5) == b""
            c.replicas["a0"].release.set()
            head, _ = await read_response(slow[0])
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, head
            assert await asyncio.wait_for(idle[0].read(), 5) == b""  # the server closed it
            await asyncio.wait_for(leaving, 5)
            assert not c.proxy.state.connections
        finally:
            for _, writer in (busy, idle, slow):
                writer.close()

    scenario(body)


def test_repeated_headers_pass_through() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.get(c.url + "/a/cookies") as resp:
            assert resp.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        headers = [("X-Multi", "one"), ("X-Multi", "two")]
        async with s.get(c.url + "/a/x", headers=headers) as resp:  # type: ignore[arg-type]
            assert (await resp.json())["x_multi"] == ["one", "two"]

    scenario(body)


def test_max_ongoing_requests_is_respected_across_replicas() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        a0, a1 = c.replicas["a0"], c.replicas["a1"]

        async def call() -> str:
            async with s.get(c.url + "/a/slow") as resp:
                assert resp.status == 200
                return resp.headers["X-Replica"]

        tasks = [asyncio.create_task(call()) for _ in range(10)]
        await wait_until(lambda: a0.ongoing == 2 and a1.ongoing == 2)
        assert c.proxy.state.router.queued("app#A") == 6
        a0.release.set()
        a1.release.set()
        served = Counter(await asyncio.gather(*tasks))
        assert sum(served.values()) == 10
        assert a0.peak == 2 and a1.peak == 2
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, a_replicas=2, cap=2)


def test_client_disconnect_mid_request_releases_the_slot() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        a0 = c.replicas["a0"]
        _, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        writer.write(b"GET /a/slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await wait_until(lambda: a0.ongoing == 1)
        assert c.in_flight() == 1
        writer.close()
        await wait_until(lambda: c.in_flight() == 0)
        # a large body (streamed on its slot) that never finishes arriving, then the client leaves
        _, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        head = b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (4 * BIG)
        writer.write(head + b"p" * (BUFFER_BEFORE_SLOT + 1))
        await wait_until(lambda: c.in_flight() == 1)
        writer.close()
        await wait_until(lambda: c.in_flight() == 0)
        async with s.get(c.url + "/a/x") as resp:  # the replica is still usable
            assert resp.status == 200

    scenario(body, cap=1)


def test_upstream_dying_gives_502_or_close_never_a_hang() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.get(c.url + "/a/die-before") as resp:  # it reached a replica: never re-sent
            assert resp.status == 502
        with pytest.raises(aiohttp.ClientError):
            async with s.get(c.url + "/a/die-mid") as resp:
                await resp.read()
        await wait_until(lambda: c.in_flight() == 0)
        async with s.get(c.url + "/a/x") as resp:
            assert resp.status == 200

    scenario(body, a_replicas=2)


def test_upstream_refusing_connections_is_retried_elsewhere() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        await c.replicas["a1"].stop()  # a1 stays in the snapshot but refuses connections
        for _ in range(10):
            async with s.get(c.url + "/a/x") as resp:
                assert resp.status == 200
                assert (await resp.json())["replica"] == "a0"
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, a_replicas=2)


def test_no_replicas_gives_503() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.get(c.url + "/empty/x") as resp:
            assert resp.status == 503

    scenario(body, request_timeout_s=0.2)


def test_snapshot_updates_reach_the_proxy() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        await c.controller.set(
            [{"route_prefix": "/", "app": "app", "deployment": "AB"}],
            {
                "app#AB": {"max_ongoing_requests": 5, "replicas": [c.replicas["ab0"].endpoint()]},  # type: ignore[list-item]
            },
        )
        await wait_until(lambda: c.proxy.state.routes.match("/zzz") is not None)
        async with s.get(c.url + "/zzz") as resp:
            assert (await resp.json())["replica"] == "ab0"

    scenario(body)


def test_pipelined_requests_in_one_read_are_answered_in_order() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        writer.write(
            b"GET /a/one HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /a/b/three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        heads, payloads = [], []
        for _ in range(3):
            head, payload = await read_response(reader)
            heads.append(head)
            payloads.append(payload)
        assert b'"/a/one"' in payloads[0]
        assert payloads[1] == b'{"size": 5}'
        assert b'"/a/b/three"' in payloads[2] and b'"ab0"' in payloads[2]
        assert [b"Connection: close" in h for h in heads] == [False, False, True]
        assert await reader.read() == b""  # and the connection ends after the last
        writer.close()

    scenario(body)


def test_whole_requests_in_one_read_pass_verbatim_with_their_bodies() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            for request in (
                b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
                b"POST /a/size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n",
                b"GET /a/x?q=1 HTTP/1.1\r\nHost: verbatim.test\r\nX-Multi: a\r\nX-Multi: b\r\n\r\n",
            ):
                head, payload = await raw_request(reader, writer, request)
                assert head.startswith(b"HTTP/1.1 200"), head
                if b"/a/size" in request:
                    assert payload == b'{"size": 5}'
                else:
                    seen = json.loads(payload)
                    assert seen["path"] == "/a/x?q=1" and seen["host"] == "verbatim.test"
                    assert seen["x_multi"] == ["a", "b"]
        finally:
            writer.close()

    scenario(body)


def test_a_request_split_across_many_reads() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        request = b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789"
        for i in range(0, len(request), 7):
            writer.write(request[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0.01)
        head, payload = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 200") and payload == b'{"size": 10}'
        writer.close()

    scenario(body)


def test_hop_by_hop_headers_are_dropped_both_ways() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            head, payload = await raw_request(
                reader,
                writer,
                b"GET /a/x HTTP/1.1\r\nHost: x\r\nKeep-Alive: timeout=9\r\nTE: trailers\r\n"
                b"Proxy-Connection: keep-alive\r\nX-Kept: yes\r\n\r\n",
            )
            names = json.loads(payload)["headers"]
            assert "x-kept" in names
            assert not {"keep-alive", "te", "proxy-connection"} & set(names), names
            head, payload = await raw_request(
                reader, writer, b"GET /a/hop HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            assert payload == b"hop" and b"X-Replica: a0" in head
            assert b"Keep-Alive" not in head and b"Proxy-Connection" not in head
        finally:
            writer.close()

    scenario(body)


def test_http10_clients_get_their_keep_alive_spelled_out() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        for _ in range(2):  # kept alive because asked for
            head, payload = await raw_request(
                reader, writer, b"GET /a/x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            )
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive" in head
            assert b"Transfer-Encoding" not in head
        head, payload = await raw_request(reader, writer, b"GET /a/x HTTP/1.0\r\n\r\n")
        assert b"Connection: close" in head and b'"/a/x"' in payload
        assert await reader.read() == b""
        writer.close()

    scenario(body)


def test_head_responses_have_no_body_and_keep_the_connection() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            writer.write(b"HEAD /a/big HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % BIG in head
            head, payload = await raw_request(
                reader, writer, b"GET /a/x HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            assert b'"/a/x"' in payload  # the next response starts right after the head
        finally:
            writer.close()

    scenario(body)


def test_expect_100_continue_is_relayed() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            writer.write(
                b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            interim = await reader.readuntil(b"\r\n\r\n")
            assert interim.startswith(b"HTTP/1.1 100")
            writer.write(b"abcd")
            head, payload = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and payload == b'{"size": 4}'
        finally:
            writer.close()

    scenario(body)


def test_a_route_change_reaches_paths_already_served() -> None:
    # The proxy remembers each path's deployment; a new route table must replace that memory.
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.get(c.url + "/a/x") as resp:
            assert (await resp.json())["replica"] == "a0"
        await c.controller.set(
            [{"route_prefix": "/a", "app": "app", "deployment": "AB"}],
            {"app#AB": {"max_ongoing_requests": 5, "replicas": [c.replicas["ab0"].endpoint()]}},  # type: ignore[list-item]
        )
        await wait_until(lambda: "app#A" not in c.proxy.state.keys.values())
        async with s.get(c.url + "/a/x") as resp:
            assert (await resp.json())["replica"] == "ab0"

    scenario(body)


async def read_all(port: int, raw: bytes, within_s: float = 10) -> bytes:
    """Send ``raw`` on a new connection; everything the proxy answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(reader.read(), within_s)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_a_request_that_reached_a_replica_is_never_sent_again() -> None:
    # The replica may have run it: a second replica must not run it again (a 502 instead).
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        for method, path in (("GET", "/a/die-before"), ("POST", "/a/die-before")):
            async with s.request(method, c.url + path, data=b"x" * 10) as resp:
                assert resp.status == 502
                assert resp.headers["x-request-id"]
        assert sum(r.hits["/a/die-before"] for r in c.replicas.values()) == 2
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, a_replicas=2)


def test_a_request_a_draining_replica_did_not_start_goes_to_another() -> None:
    # A replica that is shutting down answers "unserved": the request never ran there, so the
    # proxy re-sends it (whole requests only) to another replica instead of failing the client.
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        c.replicas["a0"].shutting_down = True
        for method in ("GET", "POST"):
            for _ in range(10):
                async with s.request(method, c.url + "/a/x", data=b"payload") as resp:
                    assert resp.status == 200
                    assert (await resp.json())["replica"] == "a1"
        assert c.replicas["a1"].hits["/a/x"] == 20  # each request ran exactly once
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, a_replicas=2)


def test_a_request_every_replica_turns_away_waits_for_a_new_one() -> None:
    """A roll: every replica the proxy knows shuts down (or refuses connections) before discovery
    names their successor. The request waits for it instead of failing, and costs the replicas
    that turned it away nothing more: they are chosen no more."""

    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        c.replicas["a0"].shutting_down = True
        await c.replicas["a1"].stop()
        waiting = asyncio.create_task(s.get(c.url + "/a/x"))
        await wait_until(lambda: c.proxy.state.router.queued("app#A") == 1)
        successor = FakeReplica("a2")
        await successor.start()
        try:
            endpoints = [r.endpoint() for r in (c.replicas["a0"], c.replicas["a1"], successor)]
            await c.controller.set(
                [{"route_prefix": "/a", "app": "app", "deployment": "A"}],
                {"app#A": {"max_ongoing_requests": 100, "replicas": endpoints}},  # type: ignore[typeddict-item]
            )
            async with await waiting as resp:
                assert resp.status == 200
                assert (await resp.json())["replica"] == "a2"
            for _ in range(5):  # discovery still lists a0 and a1: they stay out of choice
                async with s.get(c.url + "/a/x") as resp:
                    assert (await resp.json())["replica"] == "a2"
            assert c.replicas["a0"].hits["/a/x"] == 1
        finally:
            await successor.stop()

    scenario(body, a_replicas=2)


def test_a_replica_failing_the_handshake_is_skipped() -> None:
    # Nothing was sent on a connection whose handshake failed: another replica takes the request.
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        impostor = ChannelFront(
            c.replicas["a1"].front.target_port, b"another-instance-secret-0123456"
        )
        port = await impostor.start()
        try:
            a0 = c.replicas["a0"].endpoint()
            await c.controller.set(
                [{"route_prefix": "/a", "app": "app", "deployment": "A"}],
                {
                    "app#A": {
                        "max_ongoing_requests": 100,
                        "replicas": [a0, {**a0, "replica_id": "a1", "port": port}],  # type: ignore[list-item]
                    }
                },
            )
            await wait_until(lambda: "app#AB" not in c.proxy.state.keys.values())
            for _ in range(10):
                async with s.get(c.url + "/a/x") as resp:
                    assert resp.status == 200
                    assert (await resp.json())["replica"] == "a0"
            assert c.replicas["a1"].hits.total() == 0
        finally:
            await impostor.stop()

    scenario(body, a_replicas=2)


def test_idle_pooled_connections_are_dropped_before_the_replica_would_close_them() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        peers = c.replicas["a0"].peers
        for _ in range(2):
            async with s.get(c.url + "/a/x") as resp:
                assert resp.status == 200
            for pool in c.proxy.state.pools.values():
                pool.sweep()  # used since the last sweep: kept
        assert len(set(peers)) == 1
        for _ in range(2):  # idle for a whole sweep period: closed
            for pool in c.proxy.state.pools.values():
                pool.sweep()
        async with s.get(c.url + "/a/x") as resp:
            assert resp.status == 200
        assert len(set(peers)) == 2

    scenario(body)


LIMITS = RequestLimits(
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    max_url_bytes=200,
    max_header_bytes=2000,
    max_body_bytes=10_000,
)


def test_oversized_urls_heads_and_bodies_are_refused() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        port = c.proxy.port
        data = await read_all(port, b"GET /a/x?" + b"q" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(data) == 414 and b"x-request-id: " in data
        big = b"GET /a/x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 3000 + b"\r\n\r\n"
        assert status_of(await read_all(port, big)) == 431
        # A head that never ends is cut off past the limit instead of growing the proxy.
        endless = b"GET /a/x HTTP/1.1\r\nX-Endless: " + b"e" * 100_000
        assert status_of(await read_all(port, endless)) == 431
        # Refused on the declared length, before the client sends the body.
        declared = b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n"
        assert status_of(await read_all(port, declared)) == 413
        # Chunked: refused once the body passes the limit.
        chunked = b"POST /a/size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b"1000\r\n" + b"c" * 4096 + b"\r\n"
        assert status_of(await read_all(port, chunked + chunk * 4 + b"0\r\n\r\n")) == 413
        assert c.replicas["a0"].hits["/a/size"] <= 1  # the chunked one may have begun upstream
        async with s.post(c.url + "/a/size", data=b"k" * 10_000) as resp:
            assert (await resp.json())["size"] == 10_000
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, limits=LIMITS)


def test_a_refused_upload_still_being_sent_gets_its_answer_not_a_reset() -> None:
    """A client sending a body over the limit gets the 413, then the end of the stream: the proxy
    half-closes and drops what still arrives (closing with unread bytes would reset the
    connection, and the reset can destroy the answer before the client reads it)."""

    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async def upload() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
            try:
                writer.write(b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
                for _ in range(40):  # the body goes on after the proxy answered
                    writer.write(b"u" * 25_000)
                    await writer.drain()
                    await asyncio.sleep(0.002)
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()

        answers = await asyncio.gather(*(upload() for _ in range(20)))
        assert all(status_of(a) == 413 for a in answers), [a[:40] for a in answers]
        await wait_until(lambda: not c.proxy.state.connections)
        assert c.replicas["a0"].hits.total() == 0

    scenario(body, limits=LIMITS)


def test_slowloris_connections_are_closed_after_the_head_timeout() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async def slowloris() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
            try:
                writer.write(b"GET /a/x HTTP/1.1\r\nHost: x\r\n")
                for _ in range(200):  # a header line now and then, never the end of the head
                    writer.write(b"X-A: b\r\n")
                    with contextlib.suppress(TimeoutError):
                        answer = await asyncio.wait_for(reader.read(65536), 0.05)
                        return answer + await asyncio.wait_for(reader.read(), 10)
                return b"still open"
            finally:
                writer.close()

        answers = await asyncio.gather(*(slowloris() for _ in range(50)))
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), set(answers)
        await wait_until(lambda: not c.proxy.state.connections)
        assert c.replicas["a0"].hits.total() == 0

    scenario(body, limits=LIMITS)


def test_a_stalled_large_upload_is_answered_408_and_gives_its_slot_back() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        head = b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG
        writer.write(head + b"p" * (BUFFER_BEFORE_SLOT + 1))  # streams: it takes the one slot
        await wait_until(lambda: c.in_flight() == 1)
        async with s.get(c.url + "/a/x") as resp:  # waits for the one slot, then gets it
            assert resp.status == 200
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert status_of(answer) == 408
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, cap=1, limits=dataclasses.replace(LIMITS, max_body_bytes=None))


def test_a_stalled_small_upload_holds_no_slot_and_never_reaches_a_replica() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        a0 = c.replicas["a0"]
        stalled = []
        for size in (100, BUFFER_BEFORE_SLOT):  # sized, and chunked, bodies within the bound
            reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
            head = b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
            writer.write(head + b"p" * (size - 10))
            stalled.append((reader, writer))
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        writer.write(b"POST /a/size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"10\r\n" + b"c" * 16 + b"\r\n")
        stalled.append((reader, writer))
        await asyncio.sleep(0.2)  # let the proxy read them: none may take the only slot
        started = asyncio.get_running_loop().time()
        for _ in range(3):  # served at once, not after the stalled uploads' 408
            async with s.get(c.url + "/a/x") as resp:
                assert resp.status == 200
        assert asyncio.get_running_loop().time() - started < 1.5
        assert c.in_flight() == 0
        for reader, writer in stalled:
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert status_of(answer) == 408
        assert a0.hits["/a/size"] == 0  # a request the replica never had whole never reached it
        # a complete body that came in pieces is served as before
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        writer.write(b"POST /a/size HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nabcd")
        await asyncio.sleep(0.05)
        assert c.in_flight() == 0
        writer.write(b"efgh")
        _, answer = await read_response(reader)
        writer.close()
        assert json.loads(answer) == {"size": 8}

    scenario(
        body, cap=1, limits=dataclasses.replace(LIMITS, body_timeout_s=2.0, max_body_bytes=None)
    )


def test_a_client_that_stops_reading_a_stream_is_aborted_and_its_slot_freed() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills soon
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", c.proxy.port))
        _, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /a/endless HTTP/1.1\r\nHost: x\r\n\r\n")
        writer.transport.pause_reading()  # a client that takes nothing
        await wait_until(lambda: c.in_flight() == 1)
        started = asyncio.get_running_loop().time()
        await wait_until(lambda: c.in_flight() == 0, 10)
        assert asyncio.get_running_loop().time() - started < 5
        await wait_until(lambda: c.replicas["a0"].streams_ended == 1)
        writer.transport.abort()
        async with s.get(c.url + "/a/x") as resp:  # the one slot serves others again
            assert resp.status == 200

    scenario(body, cap=1, limits=dataclasses.replace(LIMITS, send_timeout_s=1.0))


def test_a_websocket_client_that_reads_nothing_is_aborted_and_its_slot_freed() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        ws = await s.ws_connect(c.url + "/a/b/ws", max_msg_size=0)
        assert c.in_flight() == 1
        ws._response.connection.transport.pause_reading()  # type: ignore[union-attr]
        blob = b"w" * (1024 * 1024)
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # echoed back to a client that reads none of it
                await ws.send_bytes(blob)
        await wait_until(lambda: c.in_flight() == 0, 10)
        await ws.close()

    scenario(body, limits=dataclasses.replace(LIMITS, send_timeout_s=1.0, max_body_bytes=None))


def test_a_connection_that_never_sends_a_byte_is_closed_at_the_header_timeout() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:  # keep-alive is 90 s; the header timeout (0.5 s) runs from accept
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            writer.close()

    scenario(body, limits=LIMITS)


def test_connections_over_the_limit_get_a_clean_503_and_the_others_are_served() -> None:
    limits = RequestLimits(max_connections=3)

    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        held = [await asyncio.open_connection("127.0.0.1", c.proxy.port) for _ in range(3)]
        try:
            refused = await read_all(c.proxy.port, b"GET /a/x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in refused
            assert b"too many open connections" in refused
            reader, writer = held[0]  # the held connections are served as usual
            head, _ = await raw_request(reader, writer, b"GET /a/x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
        finally:
            for _, writer in held:
                writer.close()
        await wait_until(lambda: not c.proxy.state.connections)
        served = await read_all(
            c.proxy.port, b"GET /a/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert served.startswith(b"HTTP/1.1 200")
        assert c.proxy.refused_connections == 1

    scenario(body, limits=limits)


def test_request_ids_are_kept_or_made_and_always_answered() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        port = c.proxy.port
        for extra in (b"", b"Keep-Alive: 5\r\n"):  # with and without a header to drop
            mine = b"GET /a/x HTTP/1.1\r\nHost: x\r\nX-Request-Id: mine-1\r\n"
            data = await read_all(port, mine + extra + b"Connection: close\r\n\r\n")
            head, payload = data.split(b"\r\n\r\n", 1)
            assert b"x-request-id: mine-1" in head
            assert json.loads(payload)["request_id"] == ["mine-1"]
            data = await read_all(
                port, b"GET /a/x HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n" % extra
            )
            head, payload = data.split(b"\r\n\r\n", 1)
            made = json.loads(payload)["request_id"]
            assert len(made) == 1 and len(made[0]) == 32
            assert b"x-request-id: %s" % made[0].encode() in head
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:  # keep-alive requests whole in one read go out verbatim, the id spliced in
            for request in (
                b"GET /a/x HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /a/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
            ):
                head, payload = await raw_request(reader, writer, request)
                made = json.loads(payload)["request_id"]
                assert len(made) == 1 and b"x-request-id: %s" % made[0].encode() in head
        finally:
            writer.close()
        async with s.get(c.url + "/nowhere", headers={"X-Request-Id": "r404"}) as resp:
            assert resp.status == 404 and resp.headers["x-request-id"] == "r404"
        uuid = "3f2b8c1e-9d4a-4e7b-8f6a-1c2d3e4f5a6b"
        async with s.get(c.url + "/a/x", headers={"X-Request-Id": uuid}) as resp:
            assert resp.headers["x-request-id"] == uuid  # the usual spellings are kept
        async with s.get(c.url + "/-/healthz") as resp:
            assert resp.headers["x-request-id"]

    scenario(body)


@pytest.mark.parametrize(
    "given", [b"x" * 129, b"two words", b"id;evil=1", b"\xe2\x80\xa8", b"-- " * 20]
)
def test_an_unusable_request_id_is_replaced_never_echoed_or_forwarded(given: bytes) -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        request = b"GET /a/x HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\nConnection: close\r\n\r\n"
        data = await read_all(c.proxy.port, request % given)
        head, payload = data.split(b"\r\n\r\n", 1)
        made = json.loads(payload)["request_id"]
        assert len(made) == 1 and len(made[0]) == 32 and made[0].encode() != given
        assert b"x-request-id: %s" % made[0].encode() in head and given not in head

    scenario(body)


def test_connect_and_upgrades_get_exactly_one_answer() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        for request, what in (
            (
                b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03\x01",
                b"CONNECT (tunnelling)",
            ),
            (
                b"GET /a/x HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nPRI",
                b"upgrading to h2c",
            ),
        ):
            data = await read_all(c.proxy.port, request)
            assert data.count(b"HTTP/1.1 ") == 1, data
            assert status_of(data) == 501 and what in data, data
        assert c.replicas["a0"].hits.total() == 0
        # A WebSocket handshake the replica answers with a plain response: relayed as it is,
        # then the connection closes (the bytes behind the handshake are never parsed).
        data = await read_all(
            c.proxy.port,
            b"GET /a/x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            b"GET /a/y HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        assert data.count(b"HTTP/1.1 ") == 1, data
        assert status_of(data) == 200 and b"Connection: close" in data
        assert c.replicas["a0"].hits == Counter({"/a/x": 1})
        assert c.in_flight() == 0

    scenario(body)


def test_websockets_are_spliced_to_the_replica_and_hold_their_slot() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async with s.ws_connect(c.url + "/a/b/ws", max_msg_size=0) as ws:
            assert ws._response.headers["X-Replica"] == "ab0"
            assert ws._response.headers["x-request-id"]
            await ws.send_str("hello")
            assert await ws.receive_str() == "hello"
            assert c.in_flight() == 1  # one slot for the life of the socket
            big = os.urandom(BIG)  # both ways through the splice, with backpressure
            await ws.send_bytes(big)
            assert await ws.receive_bytes() == big
        await wait_until(lambda: c.in_flight() == 0)
        await wait_until(lambda: c.replicas["ab0"].sockets_closed == 1)
        # The replica closing: its code and reason reach the client, the slot is released.
        async with s.ws_connect(c.url + "/a/b/ws") as ws:
            await ws.send_str("close")
            closing = await ws.receive()
            assert (closing.type, closing.data, closing.extra) == (
                aiohttp.WSMsgType.CLOSE,
                4002,
                "replica says bye",
            )
        await wait_until(lambda: c.in_flight() == 0)
        # The client vanishing without a close frame: the replica's side ends too.
        ws = await s.ws_connect(c.url + "/a/b/ws")
        await ws.send_str("x")
        assert await ws.receive_str() == "x"
        assert c.in_flight() == 1
        ws._response.connection.transport.abort()  # type: ignore[union-attr]
        await wait_until(lambda: c.replicas["ab0"].sockets_closed == 3)
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body)


def test_frames_right_behind_the_handshake_reach_the_replica() -> None:
    from wsproto import ConnectionType, WSConnection
    from wsproto.connection import Connection
    from wsproto.events import AcceptConnection, Request, TextMessage

    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        client = WSConnection(ConnectionType.CLIENT)
        handshake = client.send(Request(host="x", target="/a/ws"))
        early = Connection(ConnectionType.CLIENT).send(TextMessage(data="early"))
        reader, writer = await asyncio.open_connection("127.0.0.1", c.proxy.port)
        try:
            writer.write(handshake + early)  # in one write, before the replica's 101
            events: list[Any] = []
            while not any(isinstance(e, TextMessage) for e in events):
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data, events
                client.receive_data(data)
                events += client.events()
            assert isinstance(events[0], AcceptConnection)
            assert [e.data for e in events if isinstance(e, TextMessage)] == ["early"]
        finally:
            writer.close()
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body)


def test_a_websocket_a_draining_replica_did_not_start_goes_to_another() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        c.replicas["a0"].shutting_down = True  # answers 503 unserved, with Connection: close
        for _ in range(6):
            async with s.ws_connect(c.url + "/a/ws") as ws:
                assert ws._response.headers["X-Replica"] == "a1"
                await ws.send_str("hi")
                assert await ws.receive_str() == "hi"
        await wait_until(lambda: c.in_flight() == 0)

    scenario(body, a_replicas=2)


def test_routes_and_internal_paths_match_on_the_normalised_path() -> None:
    async def body(c: Cluster, s: aiohttp.ClientSession) -> None:
        async def get(path: bytes) -> bytes:
            return await read_all(
                c.proxy.port, b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path
            )

        for spelling in (b"/%2D/", b"//-/", b"/./-/", b"/a/../-/", b"/%2F-/", b"/%2d/"):
            healthz = await get(spelling + b"healthz")
            assert status_of(healthz) == 200 and healthz.endswith(b"success"), spelling
            assert b'"/a/b": "app"' in await get(spelling + b"routes")
            for internal in (b"call/x", b"metrics", b"reconfigure"):
                assert status_of(await get(spelling + internal)) == 404, spelling
        assert sum(r.hits.total() for r in c.replicas.values()) == 0  # none went upstream
        for path, replica in (
            (b"/%61/x", "a0"),
            (b"/a/b/../x", "a0"),
            (b"/a//b/x", "ab0"),
            (b"/a/%62/x", "ab0"),
            (b"/z/../a/./b", "ab0"),
        ):
            answer = await get(path)
            assert status_of(answer) == 200, path
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["replica"] == replica, path
        assert status_of(await get(b"/%61b")) == 404

    scenario(body)
