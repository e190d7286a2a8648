"""Replica choice and admission control: the cap, the FIFO queue, P2C spread, updates."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import TypeVar

import pytest

from kubeserve.runtime.router import (
    BackPressure,
    DeploymentUnavailable,
    NoReplicaAvailable,
    RoutedReplica,
    Router,
)
from kubeserve.runtime.wire import DeploymentEndpoints
from support.common import run

T = TypeVar("T")
KEY = "app#d"


def endpoints(n: int, cap: int, first: int = 0) -> dict[str, DeploymentEndpoints]:
    return {
        KEY: {
            "max_ongoing_requests": cap,
            "replicas": [
                {"replica_id": f"r{i}", "host": "127.0.0.1", "port": 9000 + i}
                for i in range(first, first + n)
            ],
        }
    }


def test_cap_never_exceeded_under_concurrency() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(3, cap=2))
        peak: Counter[str] = Counter()

        async def request() -> None:
            replica = await router.assign(KEY, timeout_s=10)
            try:
                assert replica.in_flight <= 2
                peak[replica.replica_id] = max(peak[replica.replica_id], replica.in_flight)
                await asyncio.sleep(random.random() / 1000)
            finally:
                router.release(replica)

        await asyncio.gather(*(request() for _ in range(300)))
        assert max(peak.values()) == 2
        assert router.in_flight(KEY) == {"r0": 0, "r1": 0, "r2": 0}
        assert router.queued(KEY) == 0

    run(scenario(), 20)


def test_waiters_are_served_in_fifo_order() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(1, cap=1))
        held = await router.assign(KEY, timeout_s=1)
        order: list[int] = []

        async def waiter(i: int) -> None:
            replica = await router.assign(KEY, timeout_s=5)
            order.append(i)
            router.release(replica)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(0)  # enqueue in a known order
        assert router.queued(KEY) == 5
        # a newcomer may not overtake the queue even if a slot is momentarily free
        router.release(held)
        assert router.try_assign(KEY) is None
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4]

    run(scenario(), 20)


def test_queue_is_bounded() -> None:
    async def scenario() -> None:
        router = Router(max_queued=2)
        router.update(endpoints(1, cap=1))
        held = await router.assign(KEY, timeout_s=1)

        async def waiter() -> None:
            router.release(await router.assign(KEY, timeout_s=5))

        tasks = [asyncio.create_task(waiter()) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(NoReplicaAvailable, match="queued"):
            await router.assign(KEY, timeout_s=5)
        router.release(held)
        await asyncio.gather(*tasks)
        assert router.in_flight(KEY) == {"r0": 0}

    run(scenario(), 20)


def test_full_wait_times_out() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(1, cap=1))
        held = await router.assign(KEY, timeout_s=1)
        with pytest.raises(NoReplicaAvailable, match="busy"):
            await router.assign(KEY, timeout_s=0.05)
        assert router.queued(KEY) == 0
        router.release(held)
        assert router.in_flight(KEY) == {"r0": 0}

    run(scenario(), 20)


def test_cancelled_waiter_leaves_the_queue_and_leaks_nothing() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(1, cap=1))
        held = await router.assign(KEY, timeout_s=1)
        task = asyncio.create_task(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        task.cancel()
        router.release(held)  # would hand the slot to the cancelled waiter if it were still queued
        with pytest.raises(asyncio.CancelledError):
            await task
        assert router.in_flight(KEY) == {"r0": 0}
        assert router.queued(KEY) == 0

    run(scenario(), 20)


def test_power_of_two_choices_spreads_load() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(4, cap=100))
        held = [await router.assign(KEY, timeout_s=1) for _ in range(200)]
        counts = router.in_flight(KEY)
        assert sum(counts.values()) == 200
        # P2C keeps every replica close to the mean (50); random choice alone would not.
        assert max(counts.values()) - min(counts.values()) <= 4, counts
        for replica in held:
            router.release(replica)

    run(scenario(), 20)


def test_no_replicas_waits_for_an_update() -> None:
    async def scenario() -> None:
        router = Router()
        task = asyncio.create_task(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        assert router.queued(KEY) == 1
        router.update(endpoints(1, cap=1))
        replica = await task
        assert replica.replica_id == "r0"
        router.release(replica)

    run(scenario(), 20)


def test_a_deployment_with_no_replica_coming_refuses_callers_at_once() -> None:
    async def scenario() -> None:
        router = Router()
        waiting = asyncio.create_task(router.assign(KEY, timeout_s=None))
        await asyncio.sleep(0)
        failed = endpoints(0, cap=1)
        failed[KEY]["unavailable"] = "application 'app' is DEPLOY_FAILED"
        router.update(failed)  # the caller queued before is told at once, too
        with pytest.raises(DeploymentUnavailable, match="DEPLOY_FAILED") as raised:
            await waiting
        assert (raised.value.status, raised.value.retry_after_s) == (503, 10.0)
        with pytest.raises(DeploymentUnavailable, match="DEPLOY_FAILED"):
            await router.assign(KEY, timeout_s=None)
        assert router.queued(KEY) == 0
        # Replicas of it that still run (an older version's) serve whatever the status says.
        serving = endpoints(1, cap=1)
        serving[KEY]["unavailable"] = failed[KEY]["unavailable"]
        router.update(serving)
        router.release(await router.assign(KEY, timeout_s=1))

    run(scenario(), 20)


def test_no_replicas_times_out() -> None:
    async def scenario() -> None:
        router = Router()
        with pytest.raises(NoReplicaAvailable, match="no running replica"):
            await router.assign(KEY, timeout_s=0.05)
        assert router.try_assign(KEY) is None

    run(scenario(), 20)


def test_update_keeps_in_flight_counts_of_remaining_replicas() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(2, cap=5))
        held = [await router.assign(KEY, timeout_s=1) for _ in range(4)]
        before = router.in_flight(KEY)
        router.update(endpoints(3, cap=5))  # r0, r1 stay, r2 joins
        after = router.in_flight(KEY)
        assert after == {**before, "r2": 0}
        router.update(endpoints(2, cap=5, first=1))  # r0 leaves
        assert router.in_flight(KEY) == {"r1": before["r1"], "r2": 0}
        for replica in held:  # releasing slots of a removed replica is harmless
            router.release(replica)
        assert router.in_flight(KEY) == {"r1": 0, "r2": 0}

    run(scenario(), 20)


def test_update_raising_the_cap_wakes_waiters() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(1, cap=1))
        held = await router.assign(KEY, timeout_s=1)
        task = asyncio.create_task(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        router.update(endpoints(1, cap=2))
        second = await task
        assert second is held and held.in_flight == 2
        router.release(held)
        router.release(second)

    run(scenario(), 20)


def test_avoid_prefers_another_replica() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(2, cap=10))
        first = await router.assign(KEY, timeout_s=1)
        for _ in range(20):
            other = await router.assign(KEY, timeout_s=1, avoid=first)
            assert other is not first
            router.release(other)
        router.update(endpoints(1, cap=10))
        only: RoutedReplica | None = router.try_assign(KEY, avoid=first)
        assert only is not None  # best effort: the avoided replica is the only one left
        router.release(only)
        router.release(first)

    run(scenario(), 20)


def test_max_queued_requests_of_the_deployment_answers_with_its_backpressure() -> None:
    async def scenario() -> None:
        router = Router()
        limited = endpoints(1, cap=1)
        limited[KEY].update(max_queued_requests=1, backpressure_status=429, retry_after_s=2.0)
        router.update(limited)
        held = await router.assign(KEY, timeout_s=1)
        queued = asyncio.create_task(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        with pytest.raises(BackPressure, match="max_queued_requests") as refused:
            await router.assign(KEY, timeout_s=5)
        assert (refused.value.status, refused.value.retry_after_s) == (429, 2.0)
        router.release(held)
        router.release(await queued)

    run(scenario(), 20)


def test_a_caller_waiting_on_zero_replicas_is_reported_at_once() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(0, cap=1))
        starved: list[str] = []
        router.on_starved = starved.append
        task = asyncio.create_task(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        assert starved == [KEY]
        assert router.queued_counts() == {KEY: 1}
        router.update(endpoints(1, cap=1))
        router.release(await task)
        assert router.queued_counts() == {KEY: 0}

    run(scenario(), 20)


def test_a_retired_replica_is_chosen_no_more_until_discovery_drops_it_or_its_time_is_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(2, cap=10))
        r0 = next(r for r in router.replicas(KEY) if r.replica_id == "r0")
        assert router.retire(r0) and not router.retire(r0)
        router.update(endpoints(2, cap=10))  # discovery has not learnt yet: r0 stays out
        assert {r.replica_id for r in router.replicas(KEY)} == {"r1"}
        router.update(endpoints(1, cap=10, first=1))  # it has: the retirement ends
        router.update(endpoints(2, cap=10))  # a replica of that name listed again is chosen
        assert {r.replica_id for r in router.replicas(KEY)} == {"r0", "r1"}
        r0 = next(r for r in router.replicas(KEY) if r.replica_id == "r0")
        monkeypatch.setattr("kubeserve.runtime.router.RETIRED_S", 0.05)
        assert router.retire(r0)
        await asyncio.sleep(0.2)  # its time is up: listed still, it is chosen again
        assert {r.replica_id for r in router.replicas(KEY)} == {"r0", "r1"}

    run(scenario(), 20)


def test_another_process_requests_in_flight_count_against_the_cap() -> None:
    async def scenario() -> None:
        router = Router()
        router.update(endpoints(2, cap=2))
        # the native data path runs 2 on r0: only r1 has room
        router.set_external({"r0": 2})
        assert router.in_flight(KEY) == {"r0": 2, "r1": 0}
        mine = [await router.assign(KEY, timeout_s=1) for _ in range(2)]
        assert {r.replica_id for r in mine} == {"r1"}
        assert router.own_in_flight() == {"r1": 2}  # what the other process is told
        # every slot taken: a caller waits, and gets the slot the other process frees
        waiting = asyncio.ensure_future(router.assign(KEY, timeout_s=5))
        await asyncio.sleep(0)
        assert not waiting.done() and router.queued(KEY) == 1
        router.set_external({"r0": 1})
        assert (await waiting).replica_id == "r0"
        assert router.own_in_flight() == {"r0": 1, "r1": 2}
        for replica in (*mine, await asyncio.sleep(0, waiting.result())):
            router.release(replica)
        router.set_external({})
        assert router.in_flight(KEY) == {"r0": 0, "r1": 0} and router.own_in_flight() == {}

    run(scenario(), 10)
