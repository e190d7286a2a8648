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
  a sleeping worker is woken (its sleeper: one futex call at most) only when no
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
* the loop is woken through an eventfd of the hop's, registered with ``loop.add_reader`` (its
  reader resets it, then drains), and a worker with no call left wakes it and sleeps in *one*
  call of the compiled ``Sleeper`` (``native/pyext/src/hop.rs``): the GIL is released once,
  before the eventfd write, and not retaken until the worker is woken, so the loop, woken, finds
  the GIL free (``call_soon_threadsafe`` then a lock's ``acquire`` release and retake it in
  between, and the loop, woken, waits for it). A worker lists itself idle *before* that call;
  and (for a lone call) no blocked-call timer is armed at all: a request at a time costs no
  timer per request;
* without the compiled extension (or without ``os.eventfd``), a worker sleeps on a lock of its
  own and wakes the loop with ``call_soon_threadsafe`` (:class:`_LockSleeper`, same methods);
* a caller that steps its coroutine by hand (the replica's HTTP server, see :meth:`ThreadHop.then`)
  has the drain step it on right after setting the result: no task per request and no loop
  iteration between the result and the response;
* :func:`run_sync` finds the hop of the running loop without ``asyncio.get_running_loop()``, which
  makes a ``getpid()`` system call on Python 3.11.

Invariants: a call is run exactly once, by one worker. A worker's sleeper is woken only by the
one who takes it off ``_idle`` (under the GIL, ``list.pop`` and ``list.remove`` are atomic), and
a wake that comes before the sleep is kept (the compiled sleeper's flag and park token, the lock
released): a worker that lists itself then sees work queued takes itself back off, or, when a
caller took it first, its sleep returns at once; so no wake-up is lost and none is doubled. A
worker is awake from its wake-up until it lists itself idle; while one is awake, queued work is
taken by it or, if it lists itself idle after the work was queued, it sees the work and takes
itself back. ``_drain_scheduled`` is True from the moment a worker decides to wake the loop
until the drain starts; the eventfd's reader resets it before draining, so a result appended
after the drain started is seen by that drain or writes the eventfd again.

Lifetime: a hop whose loop is closed is retired (:meth:`ThreadHop.close`) by the next loop's
first :func:`run_sync`: its idle workers are woken and leave, busy ones leave after their call,
and the last to leave closes the eventfd (never while a worker could still write to it). The
eventfd is close-on-exec; a forked child drops the parent's hop (it has none of its workers)
and closes its eventfd, and its first sync call makes a hop of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import os
import threading
from _thread import allocate_lock, get_ident
from collections.abc import Callable
from typing import Any

from kubeserve.runtime.native_module import NATIVE

__all__ = ["BLOCKED_AFTER_S", "ThreadHop", "current_hop", "run_sync"]

#: How long queued work waits, with no call taken meanwhile, before one more worker is woken.
BLOCKED_AFTER_S = 0.002

#: The compiled sleeper (``native/pyext/src/hop.rs``), where the extension is built and the
#: loop can be woken through an eventfd; else :class:`_LockSleeper`.
_native: Any = NATIVE
_NativeSleeper: Any = getattr(_native, "Sleeper", None) if hasattr(os, "eventfd") else None

_Work = tuple[
    "asyncio.Future[Any]", contextvars.Context, Callable[..., Any], tuple[Any, ...], dict[str, Any]
]


class _LockSleeper:
    """The pure Python sleeper (no compiled extension): a worker sleeps on a lock of its own,
    held while it runs, released to wake it; the loop is woken with ``call_soon_threadsafe``.
    The compiled ``Sleeper`` has the same two methods."""

    __slots__ = ("_hop", "_lock")

    def __init__(self, hop: ThreadHop) -> None:
        self._hop = hop
        self._lock = allocate_lock()
        self._lock.acquire()

    def sleep(self, announce: int = -1) -> None:
        """Wake the loop to drain the results (``announce`` >= 0: the compiled sleeper's
        eventfd, unused here), then sleep until woken. RuntimeError: the loop is closed."""
        if announce >= 0:
            self._hop.loop.call_soon_threadsafe(self._hop._drain)
        self._lock.acquire()

    def wake(self) -> None:
        self._lock.release()


class ThreadHop:
    """Runs plain callables in up to ``max_workers`` threads for one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_workers: int | None = None) -> None:
        self.loop = loop
        self.thread = get_ident()  # the loop's thread (a hop is made by a call on its loop)
        self.max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._work: collections.deque[_Work] = collections.deque()
        self._done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._idle: list[Any] = []  # the sleepers of idle workers
        self._threads = 0  # only the loop's thread changes it
        self._taken = 0  # calls taken by workers (a lost increment still changes it)
        self._taken_seen = -1  # ``_taken`` at the last blocked-work check
        self._calling: set[Any] = set()  # the sleepers of workers inside a call
        self._check: asyncio.TimerHandle | None = None
        self._wake_scheduled = False
        self._drain_scheduled = False
        self._last: asyncio.Future[Any] | None = None  # the future run() returned last
        #: continuations run by the drain right after their future's result is set
        self._then: dict[asyncio.Future[Any], Callable[[], object]] = {}
        self._closed = False
        self._exits = allocate_lock()  # guards ``_live`` (workers leaving after close())
        self._live = 0  # workers started and not yet left
        #: the loop's wake-up: an eventfd its reader drains on (compiled sleepers), else -1
        #: (``call_soon_threadsafe``)
        self._fd = -1
        if _NativeSleeper is not None:
            self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            loop.add_reader(self._fd, self._drain_woken)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """A future of ``fn(*args, **kwargs)`` run in a worker thread, in a copy of the current
        context. Call from the loop's thread."""
        future = self._last = self.loop.create_future()
        self._work.append((future, contextvars.copy_context(), fn, args, kwargs))
        if len(self._idle) == self._threads and not self._wake_scheduled:
            # No worker awake: wake one once this poll's callbacks have queued their calls.
            self._wake_scheduled = True
            self.loop.call_soon(self._scheduled_wake)
        elif self._check is None and len(self._idle) < self._threads:
            # A worker is awake: it takes this after its call, unless its call blocks. (With
            # every worker asleep the one woken takes it: nothing to check yet, and no timer.)
            self._taken_seen = self._taken
            self._check = self.loop.call_later(BLOCKED_AFTER_S, self._blocked_check)
        return future

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

    def close(self) -> None:
        """The loop is closed (or going): idle workers leave, busy ones after their call; the
        last to leave closes the eventfd (never while a worker could still write to it)."""
        if self._closed:
            return
        self._closed = True
        if self._fd >= 0 and not self.loop.is_closed():
            self.loop.remove_reader(self._fd)
        with self._exits:
            if self._live == 0:
                self._close_fd()
        while self._idle:
            try:
                self._idle.pop().wake()
            except IndexError:
                break

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

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
            sleeper.wake()
        elif self._threads < self.max_workers and not self._closed:
            self._threads += 1
            with self._exits:
                self._live += 1
            threading.Thread(
                target=self._thread, name=f"kubeserve-sync-{self._threads}", daemon=True
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

    def _thread(self) -> None:
        try:
            self._worker()
        finally:
            with self._exits:
                self._live -= 1
                if self._live == 0 and self._closed:
                    self._close_fd()

    def _worker(self) -> None:
        work, done, idle, calling = self._work, self._done, self._idle, self._calling
        sleeper = _NativeSleeper() if _NativeSleeper is not None else _LockSleeper(self)
        sleep = sleeper.sleep
        # what the sleeper is given to wake the loop with: the eventfd, or any fd >= 0 (unused)
        announce = self._fd if self._fd >= 0 else 0
        while True:
            if not work:
                idle.append(sleeper)
                if self._closed:
                    return
                if work:  # queued before a caller could see us idle
                    try:
                        idle.remove(sleeper)
                        continue
                    except ValueError:  # a caller took us and woke (or wakes) us
                        pass
                sleep()
                if self._closed:
                    return
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
            del future, context, fn, args, kwargs
            done.append(outcome)
            del outcome
            if self._drain_scheduled:
                continue
            self._drain_scheduled = True
            if self._closed:
                return
            if not work:
                # Going idle: list ourselves before waking the loop, and wake it and sleep in
                # one call that releases the GIL once (compiled sleeper): the loop, woken,
                # finds the GIL free instead of waiting for it.
                idle.append(sleeper)
                if self._closed:
                    return
                if work:
                    try:
                        idle.remove(sleeper)
                    except ValueError:  # a caller took us: the sleep below returns at once
                        pass
                    else:
                        if not self._wake_loop():
                            return
                        continue
                try:
                    sleep(announce)
                except (RuntimeError, OSError):  # the loop is closed: nobody awaits results
                    return
                if self._closed:
                    return
            elif not self._wake_loop():
                return

    def _wake_loop(self) -> bool:
        """Have the loop drain the results; False when the loop is closed (nobody awaits them)."""
        try:
            if self._fd >= 0:
                _native.notify_fd(self._fd)
            else:
                self.loop.call_soon_threadsafe(self._drain)
        except (RuntimeError, OSError):
            return False
        return True

    def _drain_woken(self) -> None:
        """The eventfd's reader: a worker wrote it (results are in)."""
        _native.clear_fd(self._fd)
        self._drain()

    def _drain(self) -> None:
        self._drain_scheduled = False
        done, then = self._done, self._then
        while done:
            future, ok, value = done.popleft()
            continuation = then.pop(future, None) if then else None
            if future.cancelled():
                pass
            elif ok:
                future.set_result(value)
            else:
                future.set_exception(value)
            if continuation is not None:
                try:
                    continuation()
                except BaseException:  # (a continuation handles its Exceptions) the rest: later
                    if done and not self._drain_scheduled:
                        self._drain_scheduled = True
                        self.loop.call_soon(self._drain)
                    raise


_hop: ThreadHop | None = None


def _forked() -> None:
    """In a forked child: the parent's hop has no workers here; the child's first sync call
    makes its own hop (and eventfd), and the child holds no fd of the parent's hop."""
    global _hop
    hop, _hop = _hop, None
    if hop is not None and hop._fd >= 0:
        with contextlib.suppress(OSError):
            os.close(hop._fd)
        hop._fd = -1


os.register_at_fork(after_in_child=_forked)


def current_hop() -> ThreadHop | None:
    """This process's :class:`ThreadHop`, if a call was run on one yet."""
    return _hop


def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``asyncio.to_thread(fn, *args, **kwargs)`` on this process's :class:`ThreadHop` for the
    running loop (one per loop: a new loop, in tests, gets a new one)."""
    global _hop
    hop = _hop
    # The hop's loop is the running one when it runs in this thread (one loop runs per thread):
    # asked without asyncio.get_running_loop(), a getpid() system call per call on Python 3.11.
    if hop is None or hop.thread != get_ident() or not hop.loop.is_running():
        loop = asyncio.get_running_loop()
        if hop is None or hop.loop is not loop:
            if hop is not None and hop.loop.is_closed():
                hop.close()  # its workers leave, the last one closes its eventfd
            hop = _hop = ThreadHop(loop)
    return hop.run(fn, *args, **kwargs)
