"""Handle calls through HandleClient: discovery, routing, pickled results and errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from aiohttp import web

from kubeserve.runtime.discovery import Discovery
from kubeserve.runtime.handle_client import HandleClient
from kubeserve.runtime.router import Router
from kubeserve.runtime.wire import (
    FRAME_END,
    FRAME_ITEM,
    UNSERVED_AT_CAPACITY,
    UNSERVED_HEADER,
    Snapshot,
    decode_call,
    decode_call_with_options,
    encode_error,
    encode_frame,
    encode_result,
)
from kubeserve.sdk.errors import (
    BackPressureError,
    DeploymentUnavailableError,
    RequestCancelledError,
)
from kubeserve.sdk.ray_errors import ActorDiedError
from support.channel_front import SECRET, ChannelFront, signed_ok
from support.common import free_port, run
from support.static_source import StaticSource

T = TypeVar("T")


class Boom(Exception):
    pass


@contextlib.asynccontextmanager
async def server(app: web.Application, *, front: bool = True) -> AsyncIterator[int]:
    """Serve ``app``; its port behind the data-plane handshake (as a replica's is) unless
    ``front`` is False (a controller)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    relay = ChannelFront(port)
    try:
        yield await relay.start() if front else port
    finally:
        await relay.stop()
        await runner.cleanup()


def replica_app(peers: list[Any]) -> web.Application:
    async def call(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        args, kwargs = decode_call(await request.read())
        method = request.match_info["method"]
        if method == "add":
            return web.Response(body=encode_result(args[0] + kwargs["b"]))
        if method == "fail":
            return web.Response(status=500, body=encode_error(Boom("user code raised")))
        return web.Response(status=404, text="no such method")

    app = web.Application()
    app.router.add_post("/-/call/{method}", call)
    return app


def controller_app(snapshot: Snapshot) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        if not signed_ok(request.headers, request.rel_url.raw_path_qs):
            return web.json_response({"error": "unsigned"}, status=403)
        if int(request.query["version"]) == snapshot["version"]:
            await asyncio.sleep(float(request.query["timeout"]))
        return web.json_response(snapshot)

    app = web.Application()
    app.router.add_get("/-/snapshot", handle)
    return app


def test_calls_reach_the_replica_over_one_connection() -> None:
    async def go() -> None:
        peers: list[Any] = []
        async with server(replica_app(peers)) as replica_port:
            snapshot: Snapshot = {
                "version": 3,
                "routes": [],
                "deployments": {
                    "app#D": {
                        "max_ongoing_requests": 4,
                        "replicas": [
                            {"replica_id": "r0", "host": "127.0.0.1", "port": replica_port}
                        ],
                    },
                    "app#Empty": {"max_ongoing_requests": 4, "replicas": []},
                },
            }
            async with server(controller_app(snapshot), front=False) as controller_port:
                client = HandleClient(
                    f"http://127.0.0.1:{controller_port}", secret=SECRET, assign_timeout_s=0.2
                )
                await client.start()
                try:
                    for i in range(5):
                        assert await client.call("app", "D", "add", (i,), {"b": 10}) == i + 10
                    assert len(set(peers)) == 1  # keep-alive: one connection for all calls
                    with pytest.raises(Boom, match="user code raised"):
                        await client.call("app", "D", "fail", (), {})
                    with pytest.raises(DeploymentUnavailableError):
                        await client.call("app", "Empty", "add", (1,), {"b": 1})
                    with pytest.raises(DeploymentUnavailableError):
                        await client.call("app", "Unknown", "add", (1,), {"b": 1})
                    results = await asyncio.gather(
                        *(client.call("app", "D", "add", (i,), {"b": 0}) for i in range(20))
                    )
                    assert results == list(range(20))
                    assert client.router.in_flight("app#D") == {"r0": 0}
                finally:
                    await client.close()

    run(go(), 30)


def test_start_survives_an_unreachable_controller() -> None:
    async def go() -> None:
        router = Router()
        # a short first-snapshot wait keeps the test fast; start() must not fail either way
        source = Discovery(
            "http://127.0.0.1:9",
            secret=SECRET,
            first_snapshot_timeout_s=0.2,
        )
        client = HandleClient(secret=SECRET, assign_timeout_s=0.1, source=source, router=router)
        await client.start()
        try:
            with pytest.raises(DeploymentUnavailableError):
                await client.call("app", "D", "add", (1,), {"b": 1})
        finally:
            await client.close()

    run(go(), 30)


def _snapshot_for(port: int) -> Snapshot:
    return {
        "version": 1,
        "routes": [],
        "deployments": {
            "app#D": {
                "max_ongoing_requests": 4,
                "replicas": [{"replica_id": "r0", "host": "127.0.0.1", "port": port}],
            }
        },
    }


@contextlib.asynccontextmanager
async def started_client(port: int, **others: int) -> AsyncIterator[HandleClient]:
    """A started handle client whose deployment ``app#D`` has replica ``r0`` on ``port`` and one
    replica per keyword (replica id = port); closed after the block."""
    snapshot = _snapshot_for(port)
    for replica_id, other in others.items():
        snapshot["deployments"]["app#D"]["replicas"].append(
            {"replica_id": replica_id, "host": "127.0.0.1", "port": other}
        )
    source = StaticSource(snapshot)
    client = HandleClient(source=source, secret=SECRET)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _counting_replica(
    respond: Callable[[asyncio.StreamWriter, Any, Any], Awaitable[None]],
) -> tuple[ChannelFront, int, list[int]]:
    """A replica answering every call of a keep-alive connection with ``respond(writer, args,
    kwargs)``; the list counts the connections it was given."""
    connections = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                args, kwargs = decode_call(await reader.readexactly(length))
                await respond(writer, args, kwargs)
        writer.close()

    server, port = await _raw_replica(answer)
    return server, port, connections


async def _raw_replica(on_call: Any) -> tuple[ChannelFront, int]:
    """A replica stand-in speaking raw bytes: ``on_call(reader, writer)`` per connection,
    behind the data-plane handshake."""
    server = await asyncio.start_server(on_call, "127.0.0.1", 0)
    relay = ChannelFront(server.sockets[0].getsockname()[1], owned=server)
    return relay, await relay.start()


def test_replica_dying_mid_call_is_an_error_not_a_hang() -> None:
    async def go() -> None:
        async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await writer.drain()
            writer.transport.abort()  # the replica process died mid-answer

        server, port = await _raw_replica(die)
        try:
            async with started_client(port) as client:
                with pytest.raises(DeploymentUnavailableError, match="r0") as raised:
                    await asyncio.wait_for(client.call("app", "D", "add", (1,), {"b": 1}), 5)
                # what Ray raises for a replica that died during a call
                assert isinstance(raised.value, ActorDiedError)
                assert client.router.in_flight("app#D") == {"r0": 0}  # the slot came back
        finally:
            await server.stop()

    run(go(), 30)


def test_replica_dying_mid_stream_raises_rays_actor_died_error() -> None:
    async def go() -> None:
        async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.transport.abort()  # the replica process died with the stream open

        server, port = await _raw_replica(die)
        try:
            async with started_client(port) as client:
                with pytest.raises(ActorDiedError, match="r0"):
                    async for _ in client.stream("app", "D", "numbers", (3,), {}):
                        pass
                assert client.router.in_flight("app#D") == {"r0": 0}
        finally:
            await server.stop()

    run(go(), 30)


def test_connections_are_reused_and_closed_when_the_replica_leaves() -> None:
    async def go() -> None:
        async def add(writer: asyncio.StreamWriter, args: Any, kwargs: Any) -> None:
            body = encode_result(args[0] + kwargs["b"])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            writer.write(body)

        server, port, connections = await _counting_replica(add)
        try:
            async with started_client(port) as client:
                for i in range(10):
                    assert await client.call("app", "D", "add", (i,), {"b": 1}) == i + 1
                assert connections == [1]
                results = await asyncio.gather(
                    *(client.call("app", "D", "add", (i,), {"b": 0}) for i in range(4))
                )
                assert results == list(range(4))
                pool = client._pools["r0"]
                client.apply({"version": 2, "routes": [], "deployments": {}})
                assert pool.closed and not pool.idle and "r0" not in client._pools
        finally:
            await server.stop()

    run(go(), 30)


def test_a_stream_read_to_its_end_leaves_its_connection_for_the_next() -> None:
    async def go() -> None:
        async def numbers(writer: asyncio.StreamWriter, args: Any, _kwargs: Any) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            frames = [encode_frame(FRAME_ITEM, encode_result(i)) for i in range(args[0])]
            for frame in [*frames, encode_frame(FRAME_END)]:
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()  # the body's last bytes apart from its end frame
            writer.write(b"0\r\n\r\n")

        server, port, connections = await _counting_replica(numbers)
        try:
            async with started_client(port) as client:
                for n in (3, 0, 5):
                    items = [i async for i in client.stream("app", "D", "numbers", (n,), {})]
                    assert items == list(range(n))
                assert connections == [1]
                # left before its end: closed (which stops the replica's generator), not reused
                async with contextlib.aclosing(
                    client.stream("app", "D", "numbers", (3,), {})
                ) as items:
                    assert await anext(items) == 0
                assert [i async for i in client.stream("app", "D", "numbers", (2,), {})] == [0, 1]
                assert connections == [2]
                assert client.router.in_flight("app#D") == {"r0": 0}
        finally:
            await server.stop()

    run(go(), 30)


def test_a_call_that_reached_a_replica_is_never_sent_again() -> None:
    # The replica took the call and died before answering: it may have run it, so the caller
    # gets an error and no other replica runs it a second time.
    async def go() -> None:
        received = 0

        async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal received
            await reader.readuntil(b"\r\n\r\n")
            received += 1
            writer.transport.abort()

        dying, dying_port = await _raw_replica(die)
        peers: list[Any] = []
        try:
            async with (
                server(replica_app(peers)) as healthy_port,
                started_client(dying_port, r1=healthy_port) as client,
            ):
                failures = 0
                for _ in range(20):
                    try:
                        await asyncio.wait_for(client.call("app", "D", "add", (1,), {"b": 1}), 5)
                    except DeploymentUnavailableError:
                        failures += 1
                assert received >= 1 and failures == received  # each one failed, none re-sent
                assert len(peers) == 20 - received
                # Idle connections are swept: kept while in use, closed once idle a whole period.
                pool = client._pools["r1"]
                pool.sweep()
                assert pool.idle
                pool.sweep()
                assert not pool.idle
        finally:
            await dying.stop()

    run(go(), 30)


def test_a_call_that_never_reached_a_replica_goes_to_another() -> None:
    # Connection refused, or a peer failing the handshake: nothing was sent, so another replica
    # takes the call and the caller never notices.
    async def go() -> None:
        peers: list[Any] = []
        async with server(replica_app(peers)) as healthy_port:
            impostor = ChannelFront(healthy_port, b"another-instance-secret-0123456")
            impostor_port = await impostor.start()
            try:
                calls = 0
                for bad in (free_port(), impostor_port):  # refusing, then failing the handshake
                    async with started_client(healthy_port, bad=bad) as client:
                        # The router picks at random, so the bad replica is tried at some call:
                        # every call succeeds, and once tried the bad replica is dropped.
                        for i in range(64):
                            assert await client.call("app", "D", "add", (i,), {"b": 1}) == i + 1
                            calls += 1
                            if client.router.in_flight("app#D") == {"r0": 0}:
                                break
                        assert client.router.in_flight("app#D") == {"r0": 0}
                        # ... and is chosen no more
                        for i in range(8):
                            assert await client.call("app", "D", "add", (i,), {"b": 1}) == i + 1
                            calls += 1
                        assert client.router.in_flight("app#D") == {"r0": 0}
                assert len(peers) == calls
            finally:
                await impostor.stop()

    run(go(), 30)


def test_a_call_a_draining_replica_did_not_start_goes_to_another() -> None:
    async def go() -> None:
        async def unserved(request: web.Request) -> web.Response:
            await request.read()
            headers = {UNSERVED_HEADER: "shutting-down", "Connection": "close"}
            return web.Response(status=503, text="replica is shutting down", headers=headers)

        draining = web.Application()
        draining.router.add_post("/-/call/{method}", unserved)
        peers: list[Any] = []
        async with (
            server(replica_app(peers)) as healthy,
            server(draining) as leaving,
            started_client(healthy, leaving=leaving) as client,
        ):
            for i in range(8):
                assert await client.call("app", "D", "add", (i,), {"b": 1}) == i + 1
        assert len(peers) == 8  # each call ran once, on the replica that took it

    run(go(), 30)


def test_a_call_a_full_replica_refused_waits_and_runs_once_there_is_room() -> None:
    async def go() -> None:
        refusals = 5
        ran: list[int] = []

        async def full_then_free(request: web.Request) -> web.Response:
            nonlocal refusals
            args, _ = decode_call(await request.read())
            if refusals:  # other callers hold every slot
                refusals -= 1
                headers = {UNSERVED_HEADER: UNSERVED_AT_CAPACITY}
                return web.Response(status=503, text="at max_ongoing_requests", headers=headers)
            ran.append(args[0])
            return web.Response(body=encode_result(args[0]))

        app = web.Application()
        app.router.add_post("/-/call/{method}", full_then_free)
        async with server(app) as port, started_client(port) as client:
            assert await client.call("app", "D", "echo", (7,), {}) == 7
        assert ran == [7]  # refused five times, more than the connect attempts, then run once

    run(go(), 30)


def test_max_queued_requests_refuses_at_once_with_backpressure_error() -> None:
    async def go() -> None:
        snapshot = _snapshot_for(free_port())
        snapshot["deployments"]["app#D"]["replicas"] = []
        snapshot["deployments"]["app#D"]["max_queued_requests"] = 1
        source = StaticSource(snapshot)
        client = HandleClient(source=source, secret=SECRET, assign_timeout_s=5)
        await client.start()
        try:
            waiting = asyncio.ensure_future(client.call("app", "D", "add", (1,), {"b": 1}))
            await asyncio.sleep(0.05)
            with pytest.raises(BackPressureError, match="max_queued_requests"):
                await client.call("app", "D", "add", (1,), {"b": 1})
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        finally:
            await client.close()

    run(go(), 30)


# -- calls started at once (HandleClient.start_call, what DeploymentHandle.remote uses) ---------


def _options_app(seen: list[dict[str, Any]]) -> web.Application:
    """A replica answering ``echo`` with its first argument, recording each call's options."""

    async def call(request: web.Request) -> web.Response:
        args, _, options = decode_call_with_options(await request.read())
        seen.append(options)
        return web.Response(body=encode_result(args[0] if args else None))

    app = web.Application()
    app.router.add_post("/-/call/{method}", call)
    return app


def test_a_call_started_at_once_is_answered_without_a_task_over_the_pooled_connection() -> None:
    async def go() -> None:
        peers: list[Any] = []
        async with server(replica_app(peers)) as port, started_client(port) as client:
            # no connection yet: a task makes one
            first = client.start_call("app", "D", "add", (1,), {"b": 1})
            assert isinstance(first, asyncio.Task)
            assert await first == 2
            started = client.start_call("app", "D", "add", (2,), {"b": 3})
            # written already, on the pooled connection, its slot taken: a future, no task
            assert started is not None and not isinstance(started, asyncio.Task)
            assert client.router.in_flight("app#D") == {"r0": 1}
            assert await started == 5
            assert client.router.in_flight("app#D") == {"r0": 0}
            failing = client.start_call("app", "D", "fail", (), {})
            assert failing is not None and not isinstance(failing, asyncio.Task)
            with pytest.raises(Boom, match="user code raised"):
                await failing
            together = [client.start_call("app", "D", "add", (i,), {"b": 0}) for i in range(6)]
            assert await asyncio.gather(*together) == list(range(6))  # type: ignore[arg-type]
            assert client.router.in_flight("app#D") == {"r0": 0}
            assert len(peers) == 9 and len(client._pools["r0"].idle) >= 1
            # nothing pickles: None, and call() raises the error
            assert client.start_call("app", "D", "add", (lambda: 1,), {}) is None
            assert client.router.in_flight("app#D") == {"r0": 0}

    run(go(), 30)


def test_a_call_started_at_once_that_a_dying_replica_took_is_an_error_and_its_slot_comes_back() -> (
    None
):
    async def go() -> None:
        calls = 0

        async def die_on_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal calls
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    calls += 1
                    if calls == 2:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
                        await writer.drain()
                        writer.transport.abort()  # died mid-answer
                        return
                    body = encode_result("ok")
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)

        relay, port = await _raw_replica(die_on_second)
        try:
            async with started_client(port) as client:
                assert await client.call("app", "D", "x", (), {}) == "ok"
                started = client.start_call("app", "D", "x", (), {})
                assert started is not None and not isinstance(started, asyncio.Task)
                with pytest.raises(ActorDiedError, match="r0"):
                    await asyncio.wait_for(started, 5)
                assert client.router.in_flight("app#D") == {"r0": 0}
                assert calls == 2  # never sent again
        finally:
            await relay.stop()

    run(go(), 30)


def test_a_call_started_at_once_that_the_replica_did_not_serve_goes_on_elsewhere() -> None:
    async def go() -> None:
        refusals = 3
        ran: list[int] = []

        async def full_then_free(request: web.Request) -> web.Response:
            nonlocal refusals
            args, _ = decode_call(await request.read())
            if args[0] >= 0 and refusals:  # other callers hold every slot
                refusals -= 1
                headers = {UNSERVED_HEADER: UNSERVED_AT_CAPACITY}
                return web.Response(status=503, text="at max_ongoing_requests", headers=headers)
            ran.append(args[0])
            return web.Response(body=encode_result(args[0]))

        app = web.Application()
        app.router.add_post("/-/call/{method}", full_then_free)
        async with server(app) as port, started_client(port) as client:
            assert await client.call("app", "D", "echo", (-1,), {}) == -1  # a pooled connection
            started = client.start_call("app", "D", "echo", (7,), {})
            assert started is not None and not isinstance(started, asyncio.Task)
            assert await started == 7
            assert client.router.in_flight("app#D") == {"r0": 0}
        assert ran == [-1, 7]  # refused three times, then run once

        async def unserved(request: web.Request) -> web.Response:
            await request.read()
            headers = {UNSERVED_HEADER: "shutting-down"}
            return web.Response(status=503, text="replica is shutting down", headers=headers)

        draining = web.Application()
        draining.router.add_post("/-/call/{method}", unserved)
        peers: list[Any] = []
        async with (
            server(replica_app(peers)) as healthy,
            server(draining) as leaving,
            started_client(healthy, leaving=leaving) as client,
        ):
            for i in range(12):  # connections to both, then calls started at once on them
                if i < 4:
                    assert await client.call("app", "D", "add", (i,), {"b": 1}) == i + 1
                else:
                    started = client.start_call("app", "D", "add", (i,), {"b": 1})
                    assert started is not None
                    assert await started == i + 1
            assert client.router.in_flight("app#D") == {"r0": 0}
        assert len(peers) == 12  # each call ran once, on the replica that took it

    run(go(), 30)


def test_cancelling_a_call_started_at_once_closes_its_connection_and_frees_its_slot() -> None:
    async def go() -> None:
        lost = asyncio.Event()

        async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                args, _ = decode_call(await reader.readexactly(length))
                if args[0] == "now":
                    body = encode_result("done")
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")  # the next call: never answered
                    await reader.read()  # until the caller closes the connection
            lost.set()

        relay, port = await _raw_replica(slow)
        try:
            async with started_client(port) as client:
                assert await client.call("app", "D", "x", ("now",), {}) == "done"
                started = client.start_call("app", "D", "x", ("later",), {})
                assert started is not None and not isinstance(started, asyncio.Task)
                await asyncio.sleep(0.05)
                assert client.router.in_flight("app#D") == {"r0": 1}
                assert started.cancel()
                assert client.router.in_flight("app#D") == {"r0": 0}
                await asyncio.wait_for(lost.wait(), 5)  # the replica saw its caller leave
                assert not client._pools["r0"].idle  # that connection is not reused
                with pytest.raises(asyncio.CancelledError):
                    await started
        finally:
            await relay.stop()

    run(go(), 30)


def test_a_handle_call_is_started_at_once_and_carries_the_request_id() -> None:
    async def go() -> None:
        from kubeserve.sdk import context, transport
        from kubeserve.sdk.handle import DeploymentHandle, DeploymentResponse

        seen: list[dict[str, Any]] = []
        async with server(_options_app(seen)) as port, started_client(port) as client:
            transport.set_transport(client)
            try:
                handle = DeploymentHandle("app", "D")
                assert handle.echo is handle.echo  # the method's caller is kept
                assert await handle.echo.remote(1) == 1  # its connection
                context.request_context.set(context.RequestContext("rid-42", "", "/"))
                response = handle.echo.remote(2)
                assert isinstance(response, DeploymentResponse)
                assert response._task is not None and not isinstance(response._task, asyncio.Task)
                assert await response == 2
                assert seen[-1] == {"request_id": "rid-42"}
                models = handle.options(multiplexed_model_id="m1")
                assert await models.echo.remote(3) == 3
                assert seen[-1] == {"request_id": "rid-42", "model_id": "m1"}
                # a response among the arguments is awaited first (a task, as before)
                chained = handle.echo.remote(handle.echo.remote(4))
                assert isinstance(chained._task, asyncio.Task)
                assert await chained == 4
                # cancelled: Ray's error
                cancelled = handle.echo.remote(5)
                cancelled.cancel()
                with pytest.raises(RequestCancelledError):
                    await cancelled
                assert client.router.in_flight("app#D") == {"r0": 0}
            finally:
                transport.set_transport(None)

    run(go(), 30)
