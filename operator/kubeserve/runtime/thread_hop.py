"""Sync user code in worker threads, for the price of a hop and not of a thread pool's machinery.

Ray runs a deployment's plain (non-``async``) methods in a thread pool so a blocking call never
stalls the replica's event loop. ``asyncio.to_thread`` does that with a ``concurrent.futures``
pool: per call a ``concurrent.futures.Future``, a work item, a ``SimpleQueue`` put that wakes a
worker, a chained asyncio future and one ``call_soon_threadsafe`` (a write to the loop's self-pipe,
then an epoll wake-up) per result. Under load that machinery, not the user's code, was most of a
sync no-op's cost.

Under load that machinery, and waking one worker per call, cost more than the user's code: each
woken worker must win the GIL from the loop and from the other woken workers, a few context
switches per call (a sync no-op cost 4.7 switches per request, an async one 1).

:class:`ThreadHop` keeps the semantics (up to ``max_workers`` calls run at once, each in a copy of
the caller's context, exceptions raised in the caller) and pays less:

* the caller gets a plain asyncio future (created by the loop, in C), nothing chained;
* work goes into a deque, and one awake worker takes call after call from it without any wake-up;
  a sleeping worker is woken (by releasing the lock it sleeps on: one futex call) only when no
  worker is awake, and not at once but by a callback after the I/O callbacks of the loop's
  current iteration: the calls of all the requests that one poll returned share one wake-up
  (under load, a dozen calls per wake-up where there was one);
* a call that blocks (I/O, ``time.sleep``, a lock) must not hold back the calls queued behind it:
  while work waits behind an awake worker (a call queued while one is awake, or more than one
  queued for the worker just woken), a timer checks every :data:`BLOCKED_AFTER_S` whether any
  call was taken since the last check, and when none was and every awake worker is inside a call
  (not merely waiting for the GIL or a CPU), wakes (or starts) one more worker. Calls that block
  thus spread over up to ``max_workers`` threads within a few milliseconds, and calls that do not
  block never wake a second thread to fight the first for the GIL;
* results go into a deque and the loop is woken once per *batch*: a worker schedules a drain only
  when none is pending, and the drain completes every result that arrived meanwhile;
* a worker with no call left lists itself idle *before* it wakes the loop and sleeps right after,
  so the loop, woken, finds the GIL free rather than waiting for it (and, for a lone call, no
  blocked-call timer is armed at all: a request at a time costs no timer per request);
* a caller that steps its coroutine by hand (the replica's HTTP server, see :meth:`ThreadHop.then`)
  has the drain step it on right after setting the result: no task per request and no loop
  iteration between the result and the response;
* a caller may also hand a call's aftermath to the worker that ran it
  (:meth:`ThreadHop.run_finishing`, a :class:`Finisher`: ``on_worker`` right after the call,
  on that thread, ``on_loop`` by the drain): the replica's HTTP server has a sync handler's
  answer written by its worker at once, instead of after the loop was woken for the batch
  (see :mod:`kubeserve.runtime.replica.http`); :meth:`ThreadHop.drain_ready` lets the loop take
  the results in before deciding anything on them (a request refused at capacity);
* :func:`run_sync` finds the hop of the running loop without ``asyncio.get_running_loop()``, which
  makes a ``getpid()`` system call on Python 3.11 (a forked child forgets its parent's hop, see
  :func:`_forked`).

Invariants: a call is run exactly once, by one worker. Each worker's sleep lock is held whenever
the worker is running or listed in ``_idle``, and only the one who takes it off the list (under
the GIL, ``list.pop`` and ``list.remove`` are atomic) releases it: a worker that lists itself then
sees work queued takes itself back off, or, when a caller took it first, finds its lock already
released; so no wake-up is lost and none is doubled. A worker is awake from its wake-up until it
lists itself idle; while one is awake, queued work is taken by it or, if it lists itself idle after
the work was queued, it sees the work and takes itself back. ``_drain_scheduled`` is True from the
moment a drain is scheduled until it starts, and a result appended after the drain started is seen
by that drain or schedules the next one.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import os
import threading
from _thread import LockType, allocate_lock, get_ident
from collections.abc import Callable
from typing import Any

__all__ = ["BLOCKED_AFTER_S", "Finisher", "ThreadHop", "current_hop", "loop_hop", "run_sync"]

log = logging.getLogger("kubeserve.replica")
_NO_KWARGS: dict[str, Any] = {}

#: How long queued work waits, with no call taken meanwhile, before one more worker is woken.
BLOCKED_AFTER_S = 0.002

_Work = tuple[
    "asyncio.Future[Any] | Finisher",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class ThreadHop:
    """Runs plain callables in up to ``max_workers`` threads for one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_workers: int | None = None) -> None:
        self.loop = loop
        self.thread = get_ident()  # the loop's thread (a hop is made by a call on its loop)
        self.max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._work: collections.deque[_Work] = collections.deque()
        self._done: collections.deque[tuple[asyncio.Future[Any] | Finisher, bool, Any]] = (
            collections.deque()
        )
        self._idle: list[LockType] = []  # the sleep locks of idle workers
        self._threads = 0  # only the loop's thread changes it
        self._taken = 0  # calls taken by workers (a lost increment still changes it)
        self._taken_seen = -1  # ``_taken`` at the last blocked-work check
        self._calling: set[LockType] = set()  # the sleep locks of workers inside a call
        self._check: asyncio.TimerHandle | None = None
        self._wake_scheduled = False
        self._drain_scheduled = False
        self._last: asyncio.Future[Any] | None = None  # the future run() returned last
        #: continuations run by the drain right after their future's result is set
        self._then: dict[asyncio.Future[Any], Callable[[], object]] = {}

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """A future of ``fn(*args, **kwargs)`` run in a worker thread, in a copy of the current
        context. Call from the loop's thread."""
        future = self._last = self.loop.create_future()
        self._work.append((future, contextvars.copy_context(), fn, args, kwargs))
        self._queued()
        return future

    def run_finishing(self, finisher: Finisher, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` run in a worker thread, in a copy of the current context, then
        ``finisher.on_worker`` on that thread and ``finisher.on_loop`` by the drain (see
        :class:`Finisher`). Call from the loop's thread."""
        self._work.append((finisher, contextvars.copy_context(), fn, args, _NO_KWARGS))
        self._queued()

    def _queued(self) -> None:
        if len(self._idle) == self._threads and not self._wake_scheduled:
            # No worker awake: wake one once this poll's callbacks have queued their calls.
            self._wake_scheduled = True
            self.loop.call_soon(self._scheduled_wake)
        elif self._check is None and len(self._idle) < self._threads:
            # A worker is awake: it takes this after its call, unless its call blocks. (With
            # every worker asleep the one woken takes it: nothing to check yet, and no timer.)
            self._taken_seen = self._taken
            self._check = self.loop.call_later(BLOCKED_AFTER_S, self._blocked_check)

    def then(self, future: asyncio.Future[Any], continuation: Callable[[], object]) -> bool:
        """Have ``continuation()`` called by the drain right after ``future`` gets its outcome,
        in the same callback: no done-callback scheduled, no task stepped a loop iteration
        later. Only for the future :meth:`run` returned last, and only while nothing else
        awaits it (a coroutine stepped by hand, its caller being the continuation); False, and
        nothing registered, for any other awaitable."""
        if future is not self._last or future is None:  # (None: a bare yield, sleep(0))
            return False
        self._last = None
        self._then[future] = continuation
        return True

    def _scheduled_wake(self) -> None:
        self._wake_scheduled = False
        work = self._work
        if work and len(self._idle) == self._threads:
            self._wake()
        if len(work) > 1 and self._check is None:  # calls queued behind the one woken for
            self._taken_seen = self._taken
            self._check = self.loop.call_later(BLOCKED_AFTER_S, self._blocked_check)

    def _wake(self) -> None:
        """Wake an idle worker, else start one (up to ``max_workers``)."""
        idle = self._idle
        if idle:
            try:
                sleeper = idle.pop()
            except IndexError:  # the worker took itself back: it saw the work
                return
            sleeper.release()
        elif self._threads < self.max_workers:
            self._threads += 1
            threading.Thread(
                target=self._worker, name=f"kubeserve-sync-{self._threads}", daemon=True
            ).start()

    def _blocked_check(self) -> None:
        """Work still queued: if no call was taken since the last check, the awake workers are
        blocked in their calls, so wake one more; look again while work waits."""
        self._check = None
        if not self._work:
            return
        awake = self._threads - len(self._idle)
        if self._taken == self._taken_seen and len(self._calling) >= awake:
            self._wake()
        self._taken_seen = self._taken
        self._check = self.loop.call_later(BLOCKED_AFTER_S, self._blocked_check)

    def _worker(self) -> None:
        work, done, idle, calling = self._work, self._done, self._idle, self._calling
        sleeper = allocate_lock()
        sleeper.acquire()
        while True:
            if not work:
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
                future, context, fn, args, kwargs = work.popleft()
            except IndexError:  # another worker took it
                continue
            self._taken += 1
            calling.add(sleeper)
            try:
                outcome = (future, True, context.run(fn, *args, **kwargs))
            except BaseException as exc:
                if isinstance(exc, StopIteration):  # an asyncio future refuses to carry it
                    exc = RuntimeError(f"{fn!r} raised StopIteration")
                outcome = (future, False, exc)
            calling.discard(sleeper)
            del context, fn, args, kwargs
            done.append(outcome)
            if isinstance(future, Finisher):
                try:
                    future.on_worker(outcome[1], outcome[2])
                except BaseException:
                    log.exception("kubeserve: a sync call's finisher failed on its worker")
            del future, outcome
            if self._drain_scheduled:
                continue
            self._drain_scheduled = True
            if not work:
                # Going idle: list ourselves before waking the loop, so that the loop, woken,
                # finds the GIL released (we sleep right after) instead of waiting for it.
                idle.append(sleeper)
                if work:
                    try:
                        idle.remove(sleeper)
                    except ValueError:
                        pass
                    else:
                        if not self._wake_loop():
                            return
                        continue
                if not self._wake_loop():
                    return
                sleeper.acquire()
            elif not self._wake_loop():
                return

    def _wake_loop(self) -> bool:
        """Have the loop drain the results; False when the loop is closed (nobody awaits them)."""
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            return False
        return True

    def drain_ready(self) -> bool:
        """Take in the results already in, now (from the loop's thread); whether there were
        any."""
        if not self._done:
            return False
        self._drain()
        return True

    def _drain(self) -> None:
        self._drain_scheduled = False
        done, then = self._done, self._then
        while done:
            future, ok, value = done.popleft()
            finisher: Finisher | None = None
            continuation: Callable[[], object] | None = None
            if isinstance(future, Finisher):
                finisher = future
            else:
                continuation = then.pop(future, None) if then else None
                if future.cancelled():
                    pass
                elif ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            if finisher is not None or continuation is not None:
                try:
                    if finisher is not None:
                        finisher.on_loop(ok, value)
                    elif continuation is not None:
                        continuation()
                except BaseException:  # (a continuation handles its Exceptions) the rest: later
                    if done and not self._drain_scheduled:
                        self._drain_scheduled = True
                        self.loop.call_soon(self._drain)
                    raise


class Finisher:
    """What follows a call :meth:`ThreadHop.run_finishing` ran, in two parts: ``on_worker``, on
    the worker thread right after the call (it holds the GIL; it must not block, nor touch what
    only the loop's thread may: an asyncio transport, a future), and ``on_loop``, on the loop's
    thread, by the drain that follows. The outcome is in the results when ``on_worker`` runs,
    so ``on_loop`` may run before ``on_worker`` has returned (the worker may lose the GIL in
    between): a finisher that needs both parts done before a step uses a turnstile (see
    ``replica.ingress``). Both get ``(ok, value)``: the call's result, or the exception it
    raised. ``on_worker`` should not raise (what it raises is logged and dropped);
    ``on_loop`` raises as a loop callback does."""

    __slots__ = ()

    def on_worker(self, ok: bool, value: Any) -> None:
        """Right after the call, on its worker thread."""

    def on_loop(self, ok: bool, value: Any) -> None:
        """On the loop's thread, by the drain."""


_hop: ThreadHop | None = None


def _forked() -> None:
    """In a forked child the parent's hop has none of its workers, and its loop (forked while
    running) still looks running from the child's main thread: the child's first sync call
    makes a hop of its own."""
    global _hop
    _hop = None


os.register_at_fork(after_in_child=_forked)


def current_hop() -> ThreadHop | None:
    """This process's :class:`ThreadHop`, if a call was run on one yet."""
    return _hop


def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``asyncio.to_thread(fn, *args, **kwargs)`` on this process's :class:`ThreadHop` for the
    running loop (one per loop: a new loop, in tests, gets a new one)."""
    return loop_hop().run(fn, *args, **kwargs)


def loop_hop() -> ThreadHop:
    """This process's :class:`ThreadHop` for the running loop, made on the first call (one per
    loop: a new loop, in tests, gets a new one)."""
    global _hop
    hop = _hop
    # The hop's loop is the running one when it runs in this thread (one loop runs per thread):
    # asked without asyncio.get_running_loop(), a getpid() system call per call on Python 3.11.
    if hop is None or hop.thread != get_ident() or not hop.loop.is_running():
        loop = asyncio.get_running_loop()
        if hop is None or hop.loop is not loop:
            hop = _hop = ThreadHop(loop)
    return hop
