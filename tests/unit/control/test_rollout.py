"""Which replicas one reconcile pass stops: the surplus, and the replaced once it is safe."""

from __future__ import annotations

from kubeserve.control.rollout import (
    RAY_DEFAULT,
    SIDE_BY_SIDE,
    RolloutPolicy,
    RolloutReplica,
    rollout_step,
    stop_order,
)


def replica(
    name: str, started: float, running: bool = True, settled: bool = True
) -> RolloutReplica:
    return RolloutReplica(name, running=running, settled=settled, start_time_s=started)


def test_replicas_not_serving_yet_stop_first_then_the_newest() -> None:
    order = stop_order(
        [replica("old", 1), replica("new", 3), replica("starting", 2, running=False)]
    )
    assert [r.replica_id for r in order] == ["starting", "new", "old"]


def test_a_scale_down_stops_the_surplus_only() -> None:
    current = [replica("a", 1), replica("b", 2), replica("c", 3, running=False)]
    step = rollout_step(current, [], target=1)
    assert step.stop == ["c", "b"]
    assert (step.serving, step.settled) == (1, 1)


def test_nothing_changes_at_the_target() -> None:
    step = rollout_step([replica("a", 1), replica("b", 2)], [], target=2)
    assert step.stop == [] and (step.serving, step.settled) == (2, 2)


def test_an_old_replica_stays_until_a_new_one_serves_and_is_known() -> None:
    old = [replica("old-1", 1), replica("old-2", 2)]
    starting = [replica("new-1", 5, running=False), replica("new-2", 6, running=False)]
    assert rollout_step(starting, old, target=2).stop == []
    not_known_yet = [replica("new-1", 5, settled=False), replica("new-2", 6, running=False)]
    step = rollout_step(not_known_yet, old, target=2)
    assert step.stop == [] and (step.serving, step.settled) == (1, 0)
    one_known = [replica("new-1", 5), replica("new-2", 6, running=False)]
    assert rollout_step(one_known, old, target=2).stop == ["old-2"]
    both_known = [replica("new-1", 5), replica("new-2", 6)]
    assert rollout_step(both_known, old, target=2).stop == ["old-2", "old-1"]


def test_a_rollout_that_also_scales_up_keeps_every_old_replica_until_new_ones_serve() -> None:
    """Three old replicas, a new version with five: none goes before a new one is known."""
    old = [replica("old-1", 1), replica("old-2", 2), replica("old-3", 3)]
    starting = [replica(f"new-{i}", 10 + i, running=False) for i in range(5)]
    assert rollout_step(starting, old, target=5).stop == []
    three_known = [replica(f"new-{i}", 10 + i, running=i < 3) for i in range(5)]
    assert rollout_step(three_known, old, target=5).stop == ["old-3"]


def test_a_stopped_surplus_replica_is_not_counted_as_serving() -> None:
    current = [replica("a", 1), replica("b", 2)]
    step = rollout_step(current, [replica("old", 0)], target=1)
    assert step.stop == ["b", "old"]
    assert (step.serving, step.settled) == (1, 1)


# -- Ray's rolling_update_percentage and max_surge_percent ----------------------------------------


def test_the_bounds_round_as_ray_does() -> None:
    """Ray: a batch of ``int(p * target)`` (at least one), a surge of ``ceil(s * target / 100)``;
    with a surge nothing may be unavailable."""
    assert RAY_DEFAULT.bounds(1) == (0, 1)
    assert RAY_DEFAULT.bounds(9) == (0, 1)
    assert RAY_DEFAULT.bounds(10) == (0, 2)
    assert RolloutPolicy(0.5, 0).bounds(5) == (0, 2)
    assert RolloutPolicy(0.2, 28).bounds(25) == (7, 0)  # 28% of 25 is 7, not 8
    assert RolloutPolicy(0.2, 25).bounds(4) == (1, 0)
    assert RolloutPolicy(1.0, 100).bounds(3) == (3, 0)
    assert RolloutPolicy(0.2, 1).bounds(0) == (0, 1)  # never both zero


def test_a_config_that_sets_one_knob_gets_rays_default_for_the_other() -> None:
    assert RolloutPolicy.given(None, None, SIDE_BY_SIDE) == SIDE_BY_SIDE
    assert RolloutPolicy.given(0.5, None, SIDE_BY_SIDE) == RolloutPolicy(0.5, 0)
    assert RolloutPolicy.given(None, 25, SIDE_BY_SIDE) == RolloutPolicy(0.2, 25)


def simulate(policy: RolloutPolicy, target: int, old_count: int) -> list[tuple[int, int]]:
    """A roll of ``old_count`` running old replicas to ``target`` new ones, step by step: each
    pass stops and starts what :func:`rollout_step` says, then every started replica becomes
    running and settled. Returns (live, available) after each pass's stops and starts."""
    old = [replica(f"old-{i}", i) for i in range(old_count)]
    current: list[RolloutReplica] = []
    seen: list[tuple[int, int]] = []
    clock = 100
    for _ in range(50):
        step = rollout_step(current, old, target, policy)
        old = [r for r in old if r.replica_id not in step.stop]
        current = [r for r in current if r.replica_id not in step.stop]
        for _ in range(step.start):
            clock += 1
            current.append(replica(f"new-{clock}", clock, running=False, settled=False))
        available = sum(r.settled for r in current) + len(old)
        seen.append((len(current) + len(old), available))
        if not old and len(current) == target and all(r.settled for r in current):
            return seen
        current = [replica(r.replica_id, r.start_time_s) for r in current]  # they start
    raise AssertionError(f"no progress: {seen}")


def test_without_a_surge_a_batch_at_a_time_and_never_more_than_the_target() -> None:
    seen = simulate(RolloutPolicy(0.5, 0), target=4, old_count=4)
    assert max(live for live, _ in seen) == 4
    assert min(available for _, available in seen) == 2  # half the replicas at a time
    assert len(seen) == 3  # two batches, then settled


def test_rays_default_replaces_the_only_replica_before_its_successor_starts() -> None:
    step = rollout_step([], [replica("old", 1)], 1, RAY_DEFAULT)
    assert (step.stop, step.start) == (["old"], 1)


def test_with_a_surge_never_below_the_target_nor_above_the_surge() -> None:
    seen = simulate(RolloutPolicy(0.2, 25), target=4, old_count=4)
    assert max(live for live, _ in seen) == 5
    assert min(available for _, available in seen) == 4
    seen = simulate(SIDE_BY_SIDE, target=3, old_count=3)
    assert max(live for live, _ in seen) == 6 and min(a for _, a in seen) == 3


def test_a_surge_waits_for_the_new_replicas_to_be_known_before_old_ones_stop() -> None:
    old = [replica("old-1", 1), replica("old-2", 2)]
    step = rollout_step([replica("new", 5, settled=False)], old, 2, RolloutPolicy(0.2, 50))
    assert (step.stop, step.start) == ([], 0)  # 3 live = 2 + one surge
    step = rollout_step([replica("new", 5)], old, 2, RolloutPolicy(0.2, 50))
    assert (step.stop, step.start) == (["old-2"], 1)


def test_an_old_replica_still_starting_stops_at_once() -> None:
    old = [replica("old-1", 1), replica("old-2", 2, running=False)]
    step = rollout_step([], old, 2, RolloutPolicy(0.2, 50))
    assert (step.stop, step.start) == (["old-2"], 2)  # 3 live at most: old-1 and two new
