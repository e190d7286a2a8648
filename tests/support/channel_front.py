"""Test support: put the data-plane handshake in front of a stand-in replica server.

Proxy and handle tests use aiohttp servers as replicas (to check our HTTP code against another
implementation). Replicas only take authenticated connections, so a :class:`ChannelFront` accepts
connections on its own port, runs the replica's side of the real handshake
(:class:`~kubeserve.runtime.channel.ServerHandshake`) for whichever replica id the caller names,
then opens the caller's sealed frames and seals the stand-in's answers
(:mod:`~kubeserve.runtime.sealing`), relaying the plain bytes both ways: one stand-in connection per
accepted connection, so connection reuse stays visible to the test. ``identities`` records whom each
handshake named.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

from kubeserve.runtime import channel, sealing

#: The data-plane secret of every test instance.
SECRET = b"test-secret-0123456789abcdef0123"


def signed_ok(headers: Mapping[str, str], target: str) -> bool:
    """Whether a discovery request carries a valid signature (stand-in controllers check it)."""
    value = headers.get(channel.SIGNATURE_HEADER, "")
    return channel.verify_request(SECRET, value, "GET", target, time.time())


class LoopbackServer:
    """A server on a free loopback port whose connections are served by :meth:`serve`, each in
    a task that :meth:`stop` cancels and awaits; ``owned`` (a stand-in's server) closes with it."""

    def __init__(self, *, owned: asyncio.Server | None = None) -> None:
        self.owned = owned
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.owned is not None:
            self.owned.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.serve(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class ChannelFront(LoopbackServer):
    def __init__(
        self, target_port: int, secret: bytes = SECRET, *, owned: asyncio.Server | None = None
    ) -> None:
        super().__init__(owned=owned)
        self.target_port = target_port
        self.secret = secret
        self.roles: list[channel.Role] = []
        self.identities: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await reader.readexactly(channel.HELLO_SIZE)
            hello += await reader.readexactly(hello[-1])
        except asyncio.IncompleteReadError:
            return
        identity = hello[channel.HELLO_SIZE :].decode("utf-8", "surrogateescape")
        handshake = channel.ServerHandshake(self.secret, identity, writer.write)
        try:
            rest = handshake.feed(hello)
            while rest is None:
                data = await reader.read(64)
                if not data:
                    return
                rest = handshake.feed(data)
        except channel.ChannelError:
            return
        assert handshake.role is not None
        self.roles.append(handshake.role)
        self.identities.append(identity)
        send, receive = handshake.keys
        opener, sealer = sealing.Opener(receive), sealing.Sealer(send)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        up_writer.write(opener.feed(rest))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, seal: bool) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(sealer.seal(data) if seal else opener.feed(data))
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))
        finally:
            up_writer.close()
