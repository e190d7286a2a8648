"""The request body of a duplex call (:data:`~kubeserve.runtime.wire.DUPLEX_PREFIX`), as it arrives.

The replica's HTTP server dispatches a duplex call as soon as its head is parsed and then feeds
the body's bytes here (:meth:`Inflow.feed`) instead of buffering them; the handler reads the
frames with :meth:`Inflow.next`. Owned by the connection that feeds it: ``end`` when the body is
complete, ``lost`` when the connection went first (the caller gave up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kubeserve.runtime.wire import FRAME_END, FrameReader

__all__ = ["HIGH_WATER", "LOST", "Inflow"]

#: The kind of the frame that stands for a lost connection (no frame has it).
LOST = b""


#: Frames waiting for the handler before the connection stops reading the caller.
HIGH_WATER = 64


class Inflow:
    """Frames of one request body: ``(kind, payload)``, then ``(FRAME_END, b"")`` once it ended
    or ``(LOST, why)`` if the connection was lost first.

    Backpressure: beyond :data:`HIGH_WATER` queued frames ``hold(True)`` stops reading the
    connection until the handler took half of them (``hold(False)``), so a handler that reads
    slowly slows its caller (the proxy, then the gRPC client through HTTP/2 flow control)
    instead of filling the replica's memory."""

    __slots__ = ("_done", "_held", "_hold", "_queue", "_reader")

    def __init__(self, hold: Callable[[bool], None]) -> None:
        self._reader = FrameReader()
        self._queue: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self._done = False
        self._hold = hold
        self._held = False

    def feed(self, data: bytes) -> None:
        queue = self._queue
        for frame in self._reader.feed(data):
            queue.put_nowait(frame)
        if not self._held and queue.qsize() > HIGH_WATER:
            self._held = True
            self._hold(True)

    def end(self) -> None:
        self._finish(FRAME_END, b"")

    def lost(self, why: str) -> None:
        self._finish(LOST, why.encode())

    def _finish(self, kind: bytes, payload: bytes) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait((kind, payload))

    async def next(self) -> tuple[bytes, bytes]:
        frame = await self._queue.get()
        if self._held and self._queue.qsize() <= HIGH_WATER // 2:
            self._held = False
            self._hold(False)
        return frame
