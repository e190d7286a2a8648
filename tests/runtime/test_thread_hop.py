"""Sync user code in worker threads: the semantics of ``asyncio.to_thread``, at a hop's cost."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time

import pytest

from kubeserve.runtime.thread_hop import Finisher, ThreadHop, current_hop, run_sync
from support.common import run

REQUEST = contextvars.ContextVar("request", default="")


def test_results_exceptions_and_context_reach_the_caller() -> None:
    async def go() -> None:
        REQUEST.set("req-1")
        loop_thread = threading.get_ident()
        assert await run_sync(lambda: (REQUEST.get(), threading.get_ident() != loop_thread)) == (
            "req-1",
            True,
        )
        with pytest.raises(KeyError):
            await run_sync({}.__getitem__, "missing")

        def stop() -> None:
            raise StopIteration

        with pytest.raises(RuntimeError, match="StopIteration"):
            await run_sync(stop)
        # A change the function makes to a context variable stays in its copy.
        await run_sync(REQUEST.set, "changed")
        assert REQUEST.get() == "req-1"

    run(go(), uvloop=True)


def test_blocking_calls_run_concurrently_up_to_max_workers() -> None:
    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=4)
        running = 0
        most = 0
        lock = threading.Lock()

        def block() -> None:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.2)
            with lock:
                running -= 1

        started = time.monotonic()
        await asyncio.gather(*(hop.run(block) for _ in range(8)))
        assert most == 4
        assert time.monotonic() - started < 1.0  # two rounds of 0.2 s, not eight

    run(go(), uvloop=True)


def test_many_calls_from_many_tasks_each_complete_once() -> None:
    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=3)
        calls: list[int] = []

        async def caller(first: int) -> list[int]:
            return [
                await hop.run(lambda i=i: calls.append(i) or i) for i in range(first, first + 500)
            ]

        results = await asyncio.gather(*(caller(k * 1000) for k in range(16)))
        assert [r for rs in results for r in rs] == [
            i for k in range(16) for i in range(k * 1000, k * 1000 + 500)
        ]
        assert sorted(calls) == sorted(r for rs in results for r in rs)

    run(go(), uvloop=True)


def test_a_cancelled_caller_does_not_break_the_hop() -> None:
    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=1)
        slow = hop.run(time.sleep, 0.2)
        slow.cancel()
        assert await hop.run(lambda: "next") == "next"

    run(go(), uvloop=True)


def test_a_continuation_runs_as_its_call_completes_and_only_for_the_last_call() -> None:
    """``then`` runs the continuation in the callback that completes the call, the future
    already done; it takes only the future ``run`` returned last, never another awaitable or a
    bare yield (None), and a failed call's continuation sees the exception on the future."""

    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop())
        seen: list[object] = []
        first = hop.run(lambda: "first")
        last = hop.run(lambda: "last")
        assert not hop.then(first, lambda: seen.append("never"))
        assert not hop.then(None, lambda: seen.append("never"))  # type: ignore[arg-type]
        assert not hop.then(asyncio.get_running_loop().create_future(), lambda: None)
        assert hop.then(last, lambda: seen.append(last.result()))
        assert await first == "first"
        await asyncio.wait_for(asyncio.shield(last), 5)
        assert seen == ["last"]
        failed = hop.run({}.__getitem__, "missing")
        done = asyncio.get_running_loop().create_future()
        assert hop.then(failed, lambda: done.set_result(type(failed.exception())))
        assert await asyncio.wait_for(done, 5) is KeyError
        assert not hop.then(failed, lambda: None)  # once

    run(go(), uvloop=True)


def test_a_result_held_for_its_batch_is_not_held_behind_a_blocking_call() -> None:
    """Results of a batch go back to the loop together when the worker runs out of calls; when
    the next call of the batch blocks instead, the blocked-call check delivers the results
    already in, within a few BLOCKED_AFTER_S, not when the blocking call returns."""

    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=1)
        release = threading.Event()
        quick = hop.run(lambda: "quick")
        blocked = hop.run(release.wait, 10)
        started = time.monotonic()
        try:
            assert await asyncio.wait_for(quick, 5) == "quick"
            assert time.monotonic() - started < 0.5
            assert not blocked.done()
        finally:
            release.set()
        assert await asyncio.wait_for(blocked, 5) is True

    run(go(), uvloop=True)


def test_a_blocking_call_does_not_stall_the_calls_queued_behind_it() -> None:
    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=2)
        release = threading.Event()
        blocked = hop.run(release.wait, 10)
        await asyncio.sleep(0.01)  # the worker is inside the blocking call
        started = time.monotonic()
        try:
            quick = await asyncio.wait_for(
                asyncio.gather(*(hop.run(lambda i=i: i) for i in range(50))), 5
            )
            assert quick == list(range(50))
            assert time.monotonic() - started < 0.5
            assert not blocked.done()
        finally:
            release.set()
        assert await asyncio.wait_for(blocked, 5) is True

    run(go(), uvloop=True)


def test_no_wake_up_is_lost_under_a_stress_of_short_calls() -> None:
    """Waves of short calls queued from the loop while workers go idle and are woken: every
    call completes (a lost wake-up of a worker or of the loop would hang a wave)."""

    async def go() -> None:
        hop = ThreadHop(asyncio.get_running_loop(), max_workers=3)
        for wave in range(300):
            size = 1 + wave % 17
            futures = [hop.run(lambda i=i: i * 2) for i in range(size)]
            if wave % 3 == 0:
                await asyncio.sleep(0)  # a loop iteration between the queuing and the awaiting
            assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [
                i * 2 for i in range(size)
            ]

    run(go(), uvloop=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_makes_its_own_hop() -> None:
    """A child forked after the parent ran sync calls runs them on a hop of its own (the
    parent's workers are not in the child); the parent's hop goes on working."""

    async def calls(tag: str) -> list[str]:
        return list(await asyncio.gather(*(run_sync(lambda i=i: f"{tag}{i}") for i in range(5))))

    async def parent() -> None:
        assert await calls("p") == [f"p{i}" for i in range(5)]
        hop = current_hop()
        assert hop is not None
        pid = os.fork()
        if pid == 0:  # the child: a loop of its own
            code = 1
            try:
                loop = asyncio.new_event_loop()
                try:
                    assert loop.run_until_complete(asyncio.wait_for(calls("c"), 5)) == [
                        f"c{i}" for i in range(5)
                    ]
                    child_hop = current_hop()
                    code = 0 if child_hop is not None and child_hop is not hop else 2
                finally:
                    loop.close()
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert await calls("q") == [f"q{i}" for i in range(5)]
        assert current_hop() is hop

    run(parent(), uvloop=True)


def test_a_finisher_runs_on_the_worker_right_after_the_call_then_on_the_loop() -> None:
    """``run_finishing``: the call in a copy of the caller's context, ``on_worker`` on the
    worker thread that made it, with its outcome (an exception as ``(False, exc)``), then
    ``on_loop`` on the loop's thread; ``drain_ready`` takes the results in at once."""

    class Recorder(Finisher):
        __slots__ = ("done", "events")

        def __init__(self, done: asyncio.Future[None]) -> None:
            self.events: list[tuple[str, bool, object, int]] = []
            self.done = done

        def on_worker(self, ok: bool, value: object) -> None:
            self.events.append(("worker", ok, value, threading.get_ident()))

        def on_loop(self, ok: bool, value: object) -> None:
            self.events.append(("loop", ok, value, threading.get_ident()))
            self.done.set_result(None)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        hop = ThreadHop(loop)
        REQUEST.set("req-2")
        made = Recorder(loop.create_future())
        call_thread: list[int] = []

        def call(x: int) -> str:
            call_thread.append(threading.get_ident())
            return f"{REQUEST.get()}:{x}"

        hop.run_finishing(made, call, 7)
        await asyncio.wait_for(made.done, 5)
        (w, w_ok, w_value, w_thread), (lo, lo_ok, lo_value, lo_thread) = made.events
        assert (w, w_ok, w_value, lo, lo_ok, lo_value) == (
            "worker", True, "req-2:7", "loop", True, "req-2:7",
        )  # fmt: skip
        assert w_thread == call_thread[0] != loop_thread == lo_thread

        failed = Recorder(loop.create_future())
        hop.run_finishing(failed, {}.__getitem__, "missing")
        await asyncio.wait_for(failed.done, 5)
        assert [(e[0], e[1], type(e[2])) for e in failed.events] == [
            ("worker", False, KeyError), ("loop", False, KeyError),
        ]  # fmt: skip

        # drain_ready: the loop takes results in when it asks, not only when woken
        assert not hop.drain_ready()
        early = Recorder(loop.create_future())
        hop.run_finishing(early, lambda: "x")
        await asyncio.sleep(0)  # the worker is woken once this poll's callbacks have run
        deadline = time.monotonic() + 5
        while not early.events and time.monotonic() < deadline:
            time.sleep(0.001)  # noqa: ASYNC251 (on purpose: only drain_ready can deliver it)
        assert [e[0] for e in early.events] == ["worker"]
        assert hop.drain_ready()
        assert [e[0] for e in early.events] == ["worker", "loop"]

    run(go(), uvloop=True)


def test_a_finisher_that_raises_on_the_worker_does_not_stop_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Finisher):
        __slots__ = ("done",)

        def __init__(self, done: asyncio.Future[object]) -> None:
            self.done = done

        def on_worker(self, ok: bool, value: object) -> None:
            raise RuntimeError("broken finisher")

        def on_loop(self, ok: bool, value: object) -> None:
            self.done.set_result(value)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        hop = ThreadHop(loop, max_workers=1)
        broken = Broken(loop.create_future())
        hop.run_finishing(broken, lambda: 1)
        assert await asyncio.wait_for(broken.done, 5) == 1
        assert await asyncio.wait_for(hop.run(lambda: 2), 5) == 2  # the one worker still runs

    run(go(), uvloop=True)
    assert "finisher failed on its worker" in caplog.text
