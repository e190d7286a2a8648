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
* work goes into a deque; a worker is woken (one semaphore release) only when one is idle, so a
  busy worker takes the next call without any wake-up at all;
* results go into a deque and the loop is woken once per *batch*: a worker schedules a drain only
  when none is pending, and the drain completes every result that arrived meanwhile.

Invariants: a call is run exactly once, by one worker; a worker sleeps only after checking, under
the lock, that no work is queued (so no wake-up is lost); ``_drain_scheduled`` is True from the
moment a drain is scheduled until it starts, and a result appended after the drain started is
seen by that drain or schedules the next one.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import threading
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
        self._lock = threading.Lock()
        self._wakeup = threading.Semaphore(0)
        self._idle = 0
        self._threads = 0
        self._drain_scheduled = False

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """A future of ``fn(*args, **kwargs)`` run in a worker thread, in a copy of the current
        context. Call from the loop's thread."""
        future = self.loop.create_future()
        self._work.append((future, contextvars.copy_context(), fn, args, kwargs))
        with self._lock:
            if self._idle:
                self._idle -= 1
                wake, spawn = True, False
            else:
                wake, spawn = False, self._threads < self.max_workers
                if spawn:
                    self._threads += 1
        if wake:
            self._wakeup.release()
        elif spawn:
            threading.Thread(
                target=self._worker, name=f"kubeserve-sync-{self._threads}", daemon=True
            ).start()
        return future

    def _worker(self) -> None:
        work, done = self._work, self._done
        while True:
            try:
                future, context, fn, args, kwargs = work.popleft()
            except IndexError:
                with self._lock:
                    if work:  # queued between our look and the lock: take it
                        continue
                    self._idle += 1
                self._wakeup.acquire()
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
