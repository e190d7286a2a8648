"""A connection that reads one bounded request head, writes one answer and closes.

The base of the small unauthenticated-by-handshake listeners of a pod (the kubelet's probe port,
Prometheus' metrics port): they never read a body, never keep a connection, never buffer more
than :data:`MAX_HEAD_BYTES`, and drop a client that has not sent its head within
:data:`READ_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
from typing import cast

__all__ = ["MAX_HEAD_BYTES", "READ_TIMEOUT_S", "OneAnswerProtocol"]

#: Longest request head read before the answer is a 431.
MAX_HEAD_BYTES = 8192
#: A connection that has not sent what it must within this is closed.
READ_TIMEOUT_S = 5.0


class OneAnswerProtocol(asyncio.Protocol):
    """Reads up to ``end`` (the request line's ``\\r\\n``, or the head's ``\\r\\n\\r\\n``), then
    writes :meth:`respond`'s answer and closes; over :data:`MAX_HEAD_BYTES` it writes
    :meth:`too_large`'s."""

    end = b"\r\n\r\n"

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def respond(self, head: bytes) -> bytes:
        raise NotImplementedError

    def too_large(self) -> bytes:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._timer = asyncio.get_running_loop().call_later(READ_TIMEOUT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._buffer += data
        head, found, _ = self._buffer.partition(self.end)
        if len(head) > MAX_HEAD_BYTES or (not found and len(self._buffer) > MAX_HEAD_BYTES):
            self._answer(self.too_large())
        elif found:
            self._answer(self.respond(head))

    def _answer(self, response: bytes) -> None:
        assert self._transport is not None
        self._transport.write(response)
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
