"""Multiplex-aware replica choice: holders first, then the fewest models by rendezvous hashing,
then any free slot; the cap and the FIFO queue as for every request; what a caller knows comes
from the replicas' answers (``wire.MODELS_HEADER``)."""

from __future__ import annotations

import asyncio
from collections import Counter

from kubeserve.runtime.router import RoutedReplica, Router
from kubeserve.runtime.wire import MODELS_SHOWN, DeploymentEndpoints, decode_models, encode_models
from support.common import run

KEY = "app#d"


def endpoints(n: int, cap: int, port: int = 9000) -> dict[str, DeploymentEndpoints]:
    return {
        KEY: {
            "max_ongoing_requests": cap,
            "replicas": [
                {"replica_id": f"r{i}", "host": "127.0.0.1", "port": port + i} for i in range(n)
            ],
        }
    }


def router_with(n: int, cap: int, held: dict[str, list[str]]) -> Router:
    """A router over ``n`` replicas that heard each replica of ``held`` name its models."""
    router = Router()
    router.update(endpoints(n, cap))
    for replica in router.replicas(KEY):
        if replica.replica_id in held:
            router.note_models(replica, encode_models(held[replica.replica_id]).encode())
    return router


def by_id(router: Router, replica_id: str) -> RoutedReplica:
    return next(r for r in router.replicas(KEY) if r.replica_id == replica_id)


def test_a_request_goes_to_the_replica_holding_its_model() -> None:
    router = router_with(4, cap=100, held={"r2": ["m"], "r0": ["other"]})
    chosen = Counter()
    for _ in range(50):
        replica = router.try_assign(KEY, model_id="m")
        assert replica is not None
        chosen[replica.replica_id] += 1
    assert chosen == {"r2": 50}


def test_the_less_loaded_holder_wins_and_the_cap_is_kept() -> None:
    router = router_with(4, cap=3, held={"r1": ["m"], "r3": ["m", "n"]})
    taken = [router.try_assign(KEY, model_id="m") for _ in range(6)]
    assert Counter(r.replica_id for r in taken if r is not None) == {"r1": 3, "r3": 3}
    assert router.in_flight(KEY) == {"r0": 0, "r1": 3, "r2": 0, "r3": 3}
    # every holder full: the request takes a free slot elsewhere rather than waiting
    spill = router.try_assign(KEY, model_id="m")
    assert spill is not None and spill.replica_id in {"r0", "r2"}


def test_a_new_model_goes_to_a_replica_with_the_fewest_models() -> None:
    router = router_with(4, cap=10, held={"r0": ["a", "b"], "r1": ["c"], "r3": ["d"]})
    for i in range(20):
        replica = router.try_assign(KEY, model_id=f"new-{i}")
        assert replica is not None and replica.replica_id == "r2"
        router.release(replica)


def test_every_caller_sends_a_new_model_to_the_same_replica() -> None:
    """Rendezvous hashing: routers in different processes agree, with no word between them, and
    new models spread over the replicas."""
    first, second = router_with(5, cap=10, held={}), router_with(5, cap=10, held={})
    placed = Counter()
    for i in range(100):
        a = first.try_assign(KEY, model_id=f"model-{i}")
        b = second.try_assign(KEY, model_id=f"model-{i}")
        assert a is not None and b is not None and a.replica_id == b.replica_id
        placed[a.replica_id] += 1
        first.release(a)
        second.release(b)
    assert len(placed) == 5 and min(placed.values()) >= 8


def test_a_new_models_replica_taking_load_does_not_change_where_it_goes() -> None:
    """Concurrent first requests for one model share its load: in-flight requests (below the cap)
    do not move the rendezvous choice."""
    router = router_with(3, cap=5, held={})
    replicas = [router.try_assign(KEY, model_id="fresh") for _ in range(5)]
    assert len({r.replica_id for r in replicas if r is not None}) == 1
    sixth = router.try_assign(KEY, model_id="fresh")  # that replica is full: another takes it
    assert sixth is not None and sixth.replica_id != replicas[0].replica_id  # type: ignore[union-attr]


def test_avoid_is_respected_for_models() -> None:
    router = router_with(3, cap=5, held={"r1": ["m"]})
    holder = by_id(router, "r1")
    replica = router.try_assign(KEY, avoid=holder, model_id="m")
    assert replica is not None and replica is not holder


def test_what_replicas_say_they_hold_replaces_what_was_known() -> None:
    router = router_with(3, cap=5, held={"r0": ["a"]})
    r0 = by_id(router, "r0")
    router.note_models(r0, encode_models(["b"]).encode())  # a was evicted, b loaded
    assert router.models(KEY)["r0"] == frozenset({"b"})
    replica = router.try_assign(KEY, model_id="b")
    assert replica is r0
    router.release(replica)
    router.note_models(by_id(router, "r2"), b"")  # holds nothing
    assert router.models(KEY) == {"r0": frozenset({"b"}), "r1": frozenset(), "r2": frozenset()}


def test_replicas_that_leave_or_are_replaced_are_no_longer_holders() -> None:
    router = router_with(3, cap=5, held={"r0": ["a"], "r1": ["b"]})
    gone = by_id(router, "r0")
    router.update(
        {
            KEY: {
                "max_ongoing_requests": 5,
                "replicas": [
                    {"replica_id": "r1", "host": "127.0.0.1", "port": 9001},
                    {"replica_id": "r2", "host": "127.0.0.1", "port": 7777},  # restarted
                ],
            }
        }
    )
    assert router.models(KEY) == {"r1": frozenset({"b"}), "r2": frozenset()}
    router.note_models(gone, encode_models(["c"]).encode())  # a late answer from a replica gone
    replica = router.try_assign(KEY, model_id="a")
    assert replica is not None and replica is not gone
    replica = router.try_assign(KEY, model_id="c")
    assert replica is not None and replica is not gone
    assert router.try_assign(KEY, model_id="b") is by_id(router, "r1")


def test_queued_requests_are_handed_a_holder_in_fifo_order() -> None:
    async def scenario() -> None:
        router = router_with(2, cap=1, held={"r1": ["m"]})
        busy = [router.try_assign(KEY), router.try_assign(KEY)]
        assert all(busy)
        order: list[str] = []

        async def wait(name: str, model_id: str) -> RoutedReplica:
            replica = await router.assign(KEY, 5, model_id=model_id)
            order.append(name)
            return replica

        first = asyncio.create_task(wait("first", ""))
        second = asyncio.create_task(wait("second", "m"))
        await asyncio.sleep(0.01)
        assert router.queued(KEY) == 2
        router.update(endpoints(2, cap=3))  # two more slots on each: both waiters are served
        got_first, got_second = await first, await second
        assert order == ["first", "second"]
        assert got_second.replica_id == "r1"  # the holder, although r0 was free too
        assert sum(router.in_flight(KEY).values()) == 4
        for replica in (*busy, got_first, got_second):
            assert replica is not None
            router.release(replica)
        pool = router._pools[KEY]
        assert not pool.waiting_models and not pool.waiters

    run(scenario(), 10)


def test_a_queued_model_request_takes_any_slot_rather_than_wait_for_a_holder() -> None:
    async def scenario() -> None:
        router = router_with(2, cap=1, held={"r1": ["m"]})
        r0, r1 = router.try_assign(KEY), router.try_assign(KEY)
        assert r0 is not None and r1 is not None
        waiting = asyncio.create_task(router.assign(KEY, 5, model_id="m"))
        await asyncio.sleep(0.01)
        router.release(r0)
        assert (await waiting) is r0
        router.release(r0)
        router.release(r1)

    run(scenario(), 10)


def test_a_model_waiter_that_times_out_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        router = router_with(1, cap=1, held={})
        held = router.try_assign(KEY)
        assert held is not None
        try:
            await router.assign(KEY, 0.05, model_id="m")
        except Exception as exc:
            assert "after 0.05 s" in str(exc)
        else:
            raise AssertionError("the wait did not time out")
        pool = router._pools[KEY]
        assert not pool.waiting_models and not pool.waiters

    run(scenario(), 10)


def test_model_lists_survive_any_characters_and_stay_bounded() -> None:
    ids = ["plain", "with,comma", "spaced id", "ünï/cødé", "%41", "tab\there"]
    assert decode_models(encode_models(ids).encode()) == frozenset(ids)
    assert encode_models(ids).isascii()
    many = [f"m{i}" for i in range(MODELS_SHOWN * 3)]
    assert decode_models(encode_models(many).encode()) == frozenset(many[:MODELS_SHOWN])
    crafted = ",".join(many).encode()  # a header naming more than a replica ever sends
    assert len(decode_models(crafted)) == MODELS_SHOWN


def test_requests_without_a_model_ignore_what_replicas_hold() -> None:
    router = router_with(2, cap=1000, held={"r0": ["m"]})
    chosen = Counter()
    for _ in range(400):
        replica = router.try_assign(KEY)
        assert replica is not None
        chosen[replica.replica_id] += 1
    assert min(chosen.values()) > 50  # power of two choices on load only
