"""Leader election's decisions: who may take the Lease, when a leader must stop writing."""

from __future__ import annotations

import pytest

from kubeserve.control.leader_election import (
    LEADER_URL_ANNOTATION,
    LeaseRecord,
    LeaseTiming,
    Observation,
    Tenure,
    claim,
    release,
)

TIMING = LeaseTiming(lease_duration_s=8, renew_deadline_s=6, retry_period_s=2)


def held(holder: str, renew: str = "t0") -> LeaseRecord:
    return LeaseRecord(holder=holder, lease_duration_s=8, acquire_time="t0", renew_time=renew)


def test_a_lease_renewed_by_another_is_respected_until_it_stops_changing_for_its_duration() -> None:
    seen = Observation(held("a"), changed_at=100.0)
    assert seen.held_by_another("b", TIMING, 107.9)
    # a renewal (the record changed) restarts the wait, whatever the clocks in it say
    seen = seen.seen(held("a", renew="t1"), 107.0)
    assert seen.held_by_another("b", TIMING, 114.9)
    assert not seen.held_by_another("b", TIMING, 115.0)
    # the same record read again does not restart it
    assert seen.seen(held("a", renew="t1"), 114.0).changed_at == 107.0


def test_nobody_and_oneself_never_block_a_claim() -> None:
    assert not Observation(LeaseRecord(), 100.0).held_by_another("b", TIMING, 100.0)
    assert not Observation(held("b"), 100.0).held_by_another("b", TIMING, 100.0)


def test_a_taken_lease_counts_a_transition_and_a_renewal_keeps_the_acquire_time() -> None:
    taken = claim(held("a"), "b", "http://b:8265", TIMING, "t5")
    assert (taken.holder, taken.acquire_time, taken.renew_time, taken.transitions) == (
        "b",
        "t5",
        "t5",
        1,
    )
    renewed = claim(taken, "b", "http://b:8265", TIMING, "t6")
    assert (renewed.acquire_time, renewed.renew_time, renewed.transitions) == ("t5", "t6", 1)
    assert renewed.spec()["leaseDurationSeconds"] == 8


def test_a_released_lease_has_no_holder_and_round_trips_through_the_object() -> None:
    released = release(held("a"), "t9")
    lease = {
        "metadata": {"annotations": {LEADER_URL_ANNOTATION: ""}},
        "spec": {k: v for k, v in released.spec().items() if v is not None},
    }
    assert LeaseRecord.of(lease) == released
    assert not Observation(released, 0.0).held_by_another("b", TIMING, 0.0)


def test_a_leader_stops_writing_before_another_may_take_over() -> None:
    """The fence: the last renewal the leader knows of was sent at 100; any other replica saw
    that record at 100 or later, so it waits until 108; the leader stopped writing at 106."""
    tenure = Tenure(TIMING)
    assert not tenure.may_write(100.0)
    tenure.renewed(100.0)
    assert tenure.may_write(105.9)
    assert not tenure.may_write(106.0)
    other = Observation(held("a"), changed_at=100.0)
    assert other.held_by_another("b", TIMING, 107.9)
    tenure.end()
    assert not tenure.may_write(100.0)


@pytest.mark.parametrize("durations", [(8, 8, 2), (8, 6, 6), (8, 6, 0)])
def test_timings_that_break_the_fence_are_refused(durations: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period"):
        LeaseTiming(*durations)
