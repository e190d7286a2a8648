"""WebSockets through a real ``kubeserve start``: a FastAPI ingress written as Ray's documentation
writes one (``tests/apps/ray_websocket_app.py``), deployed through the admin API, reached on the
proxy's port with aiohttp's ``ws_connect`` as a client would reach Ray Serve."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import aiohttp
import pytest

from support.common import http, run, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

#: The instance's request body limit, which is also the largest WebSocket message.
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    """One instance serving the apps (deployed once: the machine is shared)."""
    state = tmp_path_factory.mktemp("kubeserve-ws")
    args = ("--num-cpus", "8", "--max-body-bytes", str(LIMIT))
    with running_kubeserve(state, args=args) as server:
        status, body = server.put(
            [
                {
                    "name": "echo",
                    "route_prefix": "/ws",
                    "import_path": "ray_websocket_app:echo_app",
                },
                {
                    "name": "single",
                    "route_prefix": "/single",
                    "import_path": "ray_websocket_app:echo_app",
                    "deployments": [{"name": "EchoServer", "max_ongoing_requests": 1}],
                },
                {
                    "name": "plain",
                    "route_prefix": "/plain",
                    "import_path": "ray_websocket_app:plain_app",
                },
            ]
        )
        assert status == 200, body
        for name in ("echo", "single", "plain"):
            server.wait_app(name)
        yield server


def ws_url(ks: Kubeserve, path: str) -> str:
    return f"ws://127.0.0.1:{ks.proxy_port}{path}"


def test_text_and_binary_messages_are_echoed(ks: Kubeserve) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(ks, "/ws/")) as ws:
                for text in ("hello", "", "é" * 1000):
                    await ws.send_str(text)
                    assert await ws.receive_str(timeout=10) == text
            async with session.ws_connect(ws_url(ks, "/ws/bytes")) as ws:
                for blob in (b"\x00\x01\xff", bytes(range(256)) * 200):
                    await ws.send_bytes(blob)
                    assert await ws.receive_bytes(timeout=10) == blob

    run(go())


def test_path_parameters_under_the_route_prefix_and_the_server_close_code(ks: Kubeserve) -> None:
    async def go() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(ws_url(ks, "/ws/items/7?q=seven")) as ws,
        ):
            assert await ws.receive_json(timeout=10) == {
                "item_id": 7,
                "q": "seven",
                "path": "/ws/items/7",
                "root_path": "/ws",
            }
            closing = await ws.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE
            assert (closing.data, closing.extra) == (4007, "done with item 7")
            assert ws.close_code == 4007

    run(go())


def test_a_client_closing_ends_the_handler(ks: Kubeserve) -> None:
    def disconnects() -> list[int]:
        status, body = http("GET", f"{ks.proxy}/ws/disconnects")
        assert status == 200, body
        return list(body)

    before = len(disconnects())

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(ws_url(ks, "/ws/"))
            await ws.send_str("ping")
            assert await ws.receive_str(timeout=10) == "ping"
            await ws.close(code=4321)

    run(go())
    seen = wait_for(lambda: disconnects()[before:], 10, what="the handler to see the close")
    assert seen == [4321]


def test_a_message_over_the_size_limit_closes_with_1009(ks: Kubeserve) -> None:
    async def go() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(ws_url(ks, "/ws/bytes")) as ws,
        ):
            await ws.send_bytes(b"x" * LIMIT)  # at the limit: fine
            assert len(await ws.receive_bytes(timeout=10)) == LIMIT
            await ws.send_bytes(b"x" * (LIMIT + 1))
            closing = await ws.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE
            assert closing.data == 1009

    run(go())


def test_a_message_far_over_the_size_limit_still_gets_its_1009(ks: Kubeserve) -> None:
    """The client is still sending its message when the replica refuses it: the 1009 must
    reach it through the proxy all the same, not a reset connection."""

    async def go() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(ws_url(ks, "/ws/bytes")) as ws,
        ):
            with contextlib.suppress(ConnectionError):
                await ws.send_bytes(b"x" * (LIMIT * 128))  # 8 MiB
            closing = await ws.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE, closing
            assert closing.data == 1009

    for _ in range(3):
        run(go())


def test_unknown_routes_and_plain_deployments_refuse_the_handshake(ks: Kubeserve) -> None:
    async def refused(path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refusal:
                await session.ws_connect(ws_url(ks, path))
            # What the answer says, on a plain GET with the same upgrade headers.
            headers = {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
            }
            async with session.get(f"{ks.proxy}{path}", headers=headers) as response:
                assert response.status == refusal.value.status
                return response.status, await response.text()

    async def go() -> None:
        status, text = await refused("/nowhere")
        assert status == 404 and "not found" in text
        status, text = await refused("/plain")
        assert status == 501 and "ASGI ingress" in text, text
        status, _ = await refused("/ws/no-such-websocket")  # the app's router: 403, as uvicorn
        assert status == 403

    run(go())


def test_a_websocket_holds_its_slot_until_it_closes(ks: Kubeserve) -> None:
    """``single`` takes one ongoing request: a second WebSocket waits for the first to close.
    The replica counts an open WebSocket as one ongoing request."""
    (pid,) = ks.replica_pids("single", "EchoServer")

    def ongoing() -> int:
        status, text = ks.replica_request(pid, "GET", "/-/metrics")
        assert status == 200, text
        line = next(
            line
            for line in text.decode().splitlines()
            if line.startswith("kubeserve_replica_ongoing_requests{")
        )
        return int(float(line.rsplit(" ", 1)[1]))

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            first = await session.ws_connect(ws_url(ks, "/single/"))
            await first.send_str("one")
            assert await first.receive_str(timeout=10) == "one"
            assert await asyncio.to_thread(ongoing) == 1
            second = asyncio.ensure_future(session.ws_connect(ws_url(ks, "/single/")))
            await asyncio.sleep(1.0)
            assert not second.done()  # queued for the one slot, as an HTTP request would be
            await first.close()
            ws = await asyncio.wait_for(second, 10)
            await ws.send_str("two")
            assert await ws.receive_str(timeout=10) == "two"
            await ws.close()
            # And the slot is free again for the next one.
            async with session.ws_connect(ws_url(ks, "/single/")) as third:
                await third.send_str("three")
                assert await third.receive_str(timeout=10) == "three"

    run(go())
    wait_for(lambda: ongoing() == 0, 10, what="the replica to count no ongoing request")


def test_plain_http_to_the_same_ingress_still_works(ks: Kubeserve) -> None:
    status, body = http("GET", f"{ks.proxy}/ws/disconnects")
    assert status == 200 and isinstance(body, list)
    status, body = http("GET", f"{ks.proxy}/plain")
    assert (status, body) == (200, "plain")
