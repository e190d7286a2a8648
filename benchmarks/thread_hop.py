"""The thread hop of a sync handler: kubeserve's ThreadHop against asyncio.to_thread and against
the bare hop, in turns.

    .venv/bin/python benchmarks/thread_hop.py

Tasks on uvloop each run 1,000 no-op calls in a worker thread and await them, 16 tasks at once
(calls arrive together, as wrk's 16 connections bring them to a replica loaded directly) and one
task (a call at a time, as requests arrive at a replica behind the proxy: each call pays its own
wake-ups). The floor is the bare hop: one thread's lock released by the loop, the result handed
back with one ``call_soon_threadsafe`` (two thread wake-ups per call, nothing else). Beside
them, the plain dedicated executor: one thread fed by a ``queue.SimpleQueue``. The figures are
wall and process-CPU microseconds per call, medians of 5 rounds taken in turns.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import statistics
import threading
import time
from _thread import allocate_lock
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from kubeserve.runtime.thread_hop import run_sync

CALLS = 1000


def noop() -> str:
    return "ok"


class BareHop:
    """One thread, woken by its lock per call, answering with one ``call_soon_threadsafe``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = allocate_lock()
        self.lock.acquire()
        self.box: list[tuple[asyncio.Future[Any], Callable[[], Any]]] = []
        threading.Thread(target=self._worker, daemon=True).start()

    def __call__(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.box.append((future, fn))
        self.lock.release()
        return future

    def _worker(self) -> None:
        while True:
            self.lock.acquire()
            future, fn = self.box.pop()
            self.loop.call_soon_threadsafe(future.set_result, fn())


class QueueThread:
    """A dedicated thread fed by a ``queue.SimpleQueue`` (its ``put`` wakes the thread at once),
    each result handed back with its own ``call_soon_threadsafe``: the plain dedicated executor."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._worker, daemon=True).start()

    def __call__(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.queue.put((future, contextvars.copy_context(), fn))
        return future

    def _worker(self) -> None:
        while True:
            future, context, fn = self.queue.get()
            self.loop.call_soon_threadsafe(future.set_result, context.run(fn))


async def _round(
    hop: Callable[[Callable[[], Any]], Awaitable[Any]], callers: int
) -> tuple[float, float]:
    async def caller() -> None:
        for _ in range(CALLS):
            await hop(noop)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(caller() for _ in range(callers)))
    calls = callers * CALLS
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


async def main() -> None:
    ways: dict[tuple[str, int], Callable[[Callable[[], Any]], Awaitable[Any]]] = {}
    for callers in (16, 1):
        ways["asyncio.to_thread", callers] = asyncio.to_thread
        ways["ThreadHop", callers] = run_sync
        ways["SimpleQueue thread", callers] = QueueThread(asyncio.get_running_loop())
    ways["bare hop (floor)", 1] = BareHop(asyncio.get_running_loop())  # one call at a time only
    rounds: dict[tuple[str, int], list[tuple[float, float]]] = {way: [] for way in ways}
    for _ in range(5):
        for (name, callers), way in ways.items():
            rounds[name, callers].append(await _round(way, callers))
    print("| way | callers | wall us/call | CPU us/call |\n|---|---|---|---|")
    for (name, callers), values in rounds.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"| {name} | {callers} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    uvloop.run(main())
