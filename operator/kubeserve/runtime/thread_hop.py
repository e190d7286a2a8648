"""Sync user code in worker threads, for the price of a hop and not of a thread pool's machinery.

Ray runs a deployment's plain (non-``async``) methods in a thread pool so a blocking call never
stalls the replica's event loop. ``asyncio.to_thread`` does that with a ``concurrent.futures``
pool: per call a ``concurrent.futures.Future``, a work item, a ``SimpleQueue`` put that wakes a
worker, a chained asyncio future and one ``call_soon_threadsafe`` (a write to the loop's self-pipe,
then an epoll wake-up) per result. Under load that machinery, not the user's code, was most of a
sync no-op's cost.

:class:`ThreadHop` keeps the semantics (up to ``max_workers`` calls run at once, each in a copy of
the caller's context, exceptions raised in the caller) and pays less:

* the caller gets a plain asyncio future (created by the loop, in C), nothing chained;
* work goes into a deque; a worker is woken only when one is idle, by releasing the lock it
  sleeps on (one futex call; ``threading.Semaphore`` is Python code around a ``Condition``), and
  a busy worker takes the next call without any wake-up at all;
* results go into a deque and the loop is woken once per *batch*: a worker schedules a drain only
  when none is pending, and the drain completes every result that arrived meanwhile.

Invariants: a call is run exactly once, by one worker. Each worker's sleep lock is held whenever
the worker is running or listed in ``_idle``, and only the one who takes it off the list (under
the GIL, ``list.pop`` and ``list.remove`` are atomic) releases it: a worker that lists itself then
sees work queued takes itself back off, or, when a caller took it first, finds its lock already
released; so no wake-up is lost and none is doubled. ``_drain_scheduled`` is True from the moment
a drain is scheduled until it starts, and a result appended after the drain started is seen by
that drain or schedules the next one.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import threading
from _thread import LockType, allocate_lock
from collections.abc import Callable
from typing import Any

__all__ = ["ThreadHop", "run_sync"]

_Work = tuple[
    "asyncio.Future[Any]", contextvars.Context, Callable[..., Any], tuple[Any, ...], dict[str, Any]
]


class ThreadHop:
    """Runs plain callables in up to ``max_workers`` threads for one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_workers: int | None = None) -> None:
        self.loop = loop
        self.max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._work: collections.deque[_Work] = collections.deque()
        self._done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._idle: list[LockType] = []  # the sleep locks of idle workers
        self._threads = 0  # only the loop's thread changes it
        self._drain_scheduled = False

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """A future of ``fn(*args, **kwargs)`` run in a worker thread, in a copy of the current
        context. Call from the loop's thread."""
        future = self.loop.create_future()
        self._work.append((future, contextvars.copy_context(), fn, args, kwargs))
        idle = self._idle
        if idle:
            try:
                sleeper = idle.pop()
            except IndexError:  # the worker took itself back: it saw the work
                return future
            sleeper.release()
        elif self._threads < self.max_workers:
            self._threads += 1
            threading.Thread(
                target=self._worker, name=f"kubeserve-sync-{self._threads}", daemon=True
            ).start()
        return future

    def _worker(self) -> None:
        work, done, idle = self._work, self._done, self._idle
        sleeper = allocate_lock()
        sleeper.acquire()
        while True:
            try:
                future, context, fn, args, kwargs = work.popleft()
            except IndexError:
                idle.append(sleeper)
                if work:  # queued before a caller could see us idle
                    try:
                        idle.remove(sleeper)
                        continue
                    except ValueError:  # a caller took us and releases (or released) our lock
                        pass
                sleeper.acquire()
                continue
            try:
                outcome = (future, True, context.run(fn, *args, **kwargs))
            except BaseException as exc:
                if isinstance(exc, StopIteration):  # an asyncio future refuses to carry it
                    exc = RuntimeError(f"{fn!r} raised StopIteration")
                outcome = (future, False, exc)
            del future, context, fn, args, kwargs
            done.append(outcome)
            del outcome
            if not self._drain_scheduled:
                self._drain_scheduled = True
                try:
                    self.loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: nobody awaits the results
                    return

    def _drain(self) -> None:
        self._drain_scheduled = False
        done = self._done
        while done:
            future, ok, value = done.popleft()
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


_hop: ThreadHop | None = None


def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``asyncio.to_thread(fn, *args, **kwargs)`` on this process's :class:`ThreadHop` for the
    running loop (one per loop: a new loop, in tests, gets a new one)."""
    global _hop
    loop = asyncio.get_running_loop()
    hop = _hop
    if hop is None or hop.loop is not loop:
        hop = _hop = ThreadHop(loop)
    return hop.run(fn, *args, **kwargs)
