"""The data-plane channel against a process in the middle of a replica connection.

The attack this guards against: a replica dies, a local user binds its freed port, relays the
callers' greetings to a live replica, passes that replica's proof back, then answers with bytes of
its own (a pickle the caller would load) or slips its own requests to the replica. Real replica
servers (:class:`~kubeserve.runtime.replica.http.ReplicaHttpServer` on uvloop, as in production),
the real proxy and the real channel client; only the relay in the middle is the test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from kubeserve.runtime import channel, sealing, wire
from kubeserve.runtime.proxy import ProxyServer
from kubeserve.runtime.replica.http import HttpRequest, HttpResponse, ReplicaHttpServer
from support.channel_front import SECRET, LoopbackServer
from support.common import run
from support.kubeserve_start import PickleMarker
from support.static_source import StaticSource

#: Rewrites the bytes of one direction: (bytes so far in that direction, new bytes) -> to send.
Rewrite = Callable[[int, bytes], bytes]


class Relay(LoopbackServer):
    """A process squatting a replica's address: forwards to ``target_port``, rewriting as told."""

    def __init__(
        self,
        target_port: int,
        to_replica: Rewrite | None = None,
        to_caller: Rewrite | None = None,
    ) -> None:
        super().__init__()
        self.target_port = target_port
        self.to_replica = to_replica or (lambda _seen, data: data)
        self.to_caller = to_caller or (lambda _seen, data: data)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, rewrite: Rewrite
        ) -> None:
            seen = 0
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    out = rewrite(seen, data)
                    seen += len(data)
                    if out:
                        dst.write(out)
                        await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        try:
            await asyncio.gather(
                pump(reader, up_writer, self.to_replica), pump(up_reader, writer, self.to_caller)
            )
        finally:
            up_writer.close()


class Replica:
    """A real replica server answering to ``identity``; records the paths it served."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.paths: list[str] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def handle(self, request: HttpRequest) -> HttpResponse:
        self.paths.append(request.path)
        if request.path.startswith(wire.CALL_PREFIX):
            return HttpResponse(200, wire.encode_result("from the replica"))
        return HttpResponse(200, b"from the replica")

    async def start(self) -> int:
        handler = ReplicaHttpServer(
            self.handle, control=self.handle, secret=SECRET, identity=self.identity
        )
        self.server = await asyncio.get_running_loop().create_server(handler, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port


def _forged_answer(marker: Path) -> bytes:
    """A handle call's answer holding the attacker's pickle, framed as the channel frames bytes
    (under a key of the attacker's: the session keys never cross the wire)."""
    body = pickle.dumps(PickleMarker(marker))
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    return sealing.Sealer(os.urandom(32)).seal(answer)


def test_a_greeting_relayed_to_another_replica_is_refused() -> None:
    async def go() -> None:
        live = Replica("replica-2")
        await live.start()
        relay = Relay(live.port)  # squats the port of dead "replica-1", relays to replica-2
        await relay.start()
        try:
            with pytest.raises(channel.ChannelError, match="replica-1"):
                await channel.request(
                    "127.0.0.1", relay.port, "GET", wire.HEALTHZ_PATH, SECRET, "replica-1"
                )
            assert live.paths == []
            # The same replica, named by its own id, answers.
            status, _ = await channel.request(
                "127.0.0.1", live.port, "GET", wire.HEALTHZ_PATH, SECRET, "replica-2"
            )
            assert status == 200 and live.paths == [wire.HEALTHZ_PATH]
        finally:
            await relay.stop()
            assert live.server is not None
            live.server.close()

    run(go(), uvloop=True)


def test_an_answer_forged_after_the_handshake_never_reaches_the_caller(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    forged = _forged_answer(marker)

    def forge(seen: int, data: bytes) -> bytes:
        # Pass the replica's challenge (nonce and proof), then answer in its place.
        handshake = data[: max(0, channel.CHALLENGE_SIZE - seen)]
        return handshake + (forged if len(handshake) < len(data) else b"")

    async def go() -> None:
        replica = Replica("replica-1")
        await replica.start()
        relay = Relay(replica.port, to_caller=forge)
        await relay.start()
        proxy = await _proxy_to(relay.port, "replica-1")
        try:
            # A handle-call-like internal request: the caller would unpickle the answer.
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError, ValueError)):
                await channel.request(
                    "127.0.0.1",
                    relay.port,
                    "POST",
                    wire.CALL_PREFIX + "__call__",
                    SECRET,
                    "replica-1",
                    wire.encode_call((), {}),
                )
            # Client traffic through the proxy: a 502, never the forged bytes.
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{proxy.port}/x") as resp,
            ):
                body = await resp.read()
            assert resp.status == 502, body
            assert b"PickleMarker" not in body and not marker.exists()
        finally:
            await proxy.close()
            await relay.stop()
            assert replica.server is not None
            replica.server.close()

    run(go(), uvloop=True)
    assert not marker.exists()


def test_a_request_slipped_in_after_the_handshake_never_reaches_the_replica() -> None:
    slipped = sealing.Sealer(os.urandom(32)).seal(b"GET /slipped HTTP/1.1\r\nHost: x\r\n\r\n")
    hello_and_proof: list[int] = []

    def slip(seen: int, data: bytes) -> bytes:
        # The greeting, then the caller's proof; after the proof, the relay's own request.
        if not hello_and_proof:
            hello_and_proof.append(channel.HELLO_SIZE + data[channel.HELLO_SIZE - 1])
            return data
        end = hello_and_proof[0] + channel.PROOF_SIZE
        if seen < end <= seen + len(data):
            return data[: end - seen] + slipped + data[end - seen :]
        return data

    async def go() -> None:
        replica = Replica("replica-1")
        await replica.start()
        relay = Relay(replica.port, to_replica=slip)
        await relay.start()
        try:
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError, ValueError)):
                await channel.request(
                    "127.0.0.1", relay.port, "GET", wire.HEALTHZ_PATH, SECRET, "replica-1"
                )
            assert "/slipped" not in replica.paths
        finally:
            await relay.stop()
            assert replica.server is not None
            replica.server.close()

    run(go(), uvloop=True)


async def _proxy_to(port: int, replica_id: str) -> ProxyServer:
    source = StaticSource(
        {
            "version": 1,
            "routes": [{"route_prefix": "/", "app": "a", "deployment": "D"}],
            "deployments": {
                "a#D": {
                    "max_ongoing_requests": 8,
                    "replicas": [{"replica_id": replica_id, "host": "127.0.0.1", "port": port}],
                }
            },
        }
    )
    proxy = ProxyServer("127.0.0.1", 0, source=source, secret=SECRET)
    await proxy.start()
    return proxy


# -- the frames themselves -------------------------------------------------------------------------


def _frames(*payloads: bytes, key: bytes = b"k" * 32) -> list[bytes]:
    sealer = sealing.Sealer(key)
    return [sealer.seal(p) for p in payloads]


def test_frames_open_whole_split_and_coalesced() -> None:
    frames = _frames(b"GET / HTTP/1.1\r\n", b"", b"x" * 70_000, b"end")
    stream = b"".join(frames)
    whole = sealing.Opener(b"k" * 32)
    assert b"".join(whole.feed(f) for f in frames) == b"GET / HTTP/1.1\r\n" + b"x" * 70_000 + b"end"
    for step in (1, 7, 4096):
        opener = sealing.Opener(b"k" * 32)
        got = b"".join(opener.feed(stream[i : i + step]) for i in range(0, len(stream), step))
        assert got == b"GET / HTTP/1.1\r\n" + b"x" * 70_000 + b"end"


@pytest.mark.parametrize("attack", ["flipped", "replayed", "reordered", "dropped", "other key"])
def test_a_frame_altered_replayed_reordered_or_dropped_is_refused(attack: str) -> None:
    one, two, three = _frames(b"first", b"second", b"third")
    opener = sealing.Opener(b"k" * 32)
    assert opener.feed(one) == b"first"
    bad = {
        "flipped": two[:6] + bytes([two[6] ^ 1]) + two[7:],
        "replayed": one,
        "reordered": three,
        "dropped": three,
        "other key": _frames(b"first", b"second", key=os.urandom(32))[1],
    }[attack]
    with pytest.raises(sealing.FrameError):
        opener.feed(bad)


def test_a_frame_announced_over_the_limit_is_refused_before_it_is_buffered() -> None:
    opener = sealing.Opener(b"k" * 32)
    with pytest.raises(sealing.FrameError, match="limit"):
        opener.feed((sealing.MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 100)


def test_a_handshake_names_its_replica_and_binds_the_keys_to_it() -> None:
    written: list[bytes] = []
    server = channel.ServerHandshake(SECRET, "replica-1", written.append)
    hello = channel.MAGIC + channel.Role.CONTROL.value + b"n" * 16 + b"\x09" + b"replica-2"
    with pytest.raises(channel.ChannelError, match="replica-2"):
        server.feed(hello)
    assert written == []  # no proof for a replica it is not
