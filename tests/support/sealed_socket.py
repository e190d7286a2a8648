"""Test support: a blocking socket past the data-plane handshake that speaks sealed frames.

Tests drive replicas with ``http.client`` (another HTTP implementation than ours). After the
handshake every byte on a replica connection is a sealed frame (:mod:`kubeserve.runtime.sealing`),
so :func:`sealed_socket` hands ``http.client`` an object with the two socket methods it uses,
``sendall`` (one frame per call) and ``makefile`` (a reader of the verified payloads).
"""

from __future__ import annotations

import asyncio
import io
import socket

from kubeserve.runtime import channel, sealing


class SealedSocket:
    """A blocking, sealed connection to a replica: ``sendall`` seals, reads open frames."""

    def __init__(self, sock: socket.socket, keys: tuple[bytes, bytes]) -> None:
        self.sock = sock
        send, receive = keys
        self._sealer = sealing.Sealer(send)
        self._opener = sealing.Opener(receive)
        self._pending = b""

    def sendall(self, data: bytes) -> None:
        for start in range(0, len(data), sealing.MAX_FRAME):
            chunk = bytes(data[start : start + sealing.MAX_FRAME])
            self.sock.sendall(self._sealer.seal(chunk))

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are, not sealed: what a process in the middle would inject."""
        self.sock.sendall(data)

    def recv(self, size: int) -> bytes:
        while not self._pending:
            data = self.sock.recv(65536)
            if not data:
                return b""
            self._pending = self._opener.feed(data)
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def makefile(self, mode: str = "rb", *_: object, **__: object) -> io.BufferedReader:
        assert "r" in mode and "b" in mode
        return io.BufferedReader(_Reader(self))

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, owner: SealedSocket) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._owner.recv(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def sealed_socket(
    port: int,
    role: channel.Role,
    secret: bytes,
    identity: str,
    timeout: float = 10,
    host: str = "127.0.0.1",
) -> SealedSocket:
    """A blocking sealed connection to replica ``identity`` on ``host:port``."""
    sock, _, keys = asyncio.run(channel.open_socket(host, port, role, secret, identity, timeout))
    sock.setblocking(True)
    sock.settimeout(timeout)
    return SealedSocket(sock, keys)
