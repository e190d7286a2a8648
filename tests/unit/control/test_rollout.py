"""Which replicas one reconcile pass stops: the surplus, and the replaced once it is safe."""

from __future__ import annotations

from kubeserve.control.rollout import RolloutReplica, rollout_step, stop_order


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
