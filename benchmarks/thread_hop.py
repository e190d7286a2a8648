"""The thread hop of a sync handler: kubeserve's ThreadHop against asyncio.to_thread, in turns.

    .venv/bin/python benchmarks/thread_hop.py

16 tasks on uvloop each run 1,000 no-op calls in a worker thread and await them; the figures are
wall and process-CPU microseconds per call, medians of 5 rounds taken in turns.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from kubeserve.runtime.thread_hop import run_sync

CONCURRENCY = 16
CALLS = 1000


def noop() -> str:
    return "ok"


async def _round(hop: Callable[[Callable[[], Any]], Awaitable[Any]]) -> tuple[float, float]:
    async def caller() -> None:
        for _ in range(CALLS):
            await hop(noop)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    calls = CONCURRENCY * CALLS
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


async def main() -> None:
    ways: dict[str, Callable[[Callable[[], Any]], Awaitable[Any]]] = {
        "asyncio.to_thread": asyncio.to_thread,
        "ThreadHop": run_sync,
    }
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(5):
        for name, way in ways.items():
            rounds[name].append(await _round(way))
    print("| way | wall us/call | CPU us/call |\n|---|---|---|")
    for name, values in rounds.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    uvloop.run(main())
