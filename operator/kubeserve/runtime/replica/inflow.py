"""The request body of a duplex call (:data:`~kubeserve.runtime.wire.DUPLEX_PREFIX`), as it arrives.

The replica's HTTP server dispatches a duplex call as soon as its head is parsed and then feeds
the body's bytes here (:meth:`Inflow.feed`) instead of buffering them; the handler reads the
frames with :meth:`Inflow.next`. Owned by the connection that feeds it: ``end`` when the body is
complete, ``lost`` when the connection went first (the caller gave up).
"""

from __future__ import annotations

import asyncio

from kubeserve.runtime.wire import FRAME_END, FrameReader

__all__ = ["LOST", "Inflow"]

#: The kind of the frame that stands for a lost connection (no frame has it).
LOST = b""


class Inflow:
    """Frames of one request body: ``(kind, payload)``, then ``(FRAME_END, b"")`` once it ended
    or ``(LOST, why)`` if the connection was lost first."""

    __slots__ = ("_done", "_queue", "_reader")

    def __init__(self) -> None:
        self._reader = FrameReader()
        self._queue: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self._done = False

    def feed(self, data: bytes) -> None:
        for frame in self._reader.feed(data):
            self._queue.put_nowait(frame)

    def end(self) -> None:
        self._finish(FRAME_END, b"")

    def lost(self, why: str) -> None:
        self._finish(LOST, why.encode())

    def _finish(self, kind: bytes, payload: bytes) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait((kind, payload))

    async def next(self) -> tuple[bytes, bytes]:
        return await self._queue.get()
