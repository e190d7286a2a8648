"""Leader election's decisions: who may take the Lease, when a leader must stop writing."""

from __future__ import annotations

import pytest

from kubeserve.control.leader_election import (
    LEADER_URL_ANNOTATION,
    RENEWALS_IN_FLIGHT,
    LeaseRecord,
    LeaseTiming,
    Observation,
    Tenure,
    TermState,
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
    assert tenure.renewed(100.0, now=101.0)
    assert tenure.may_write(105.9)
    assert not tenure.may_write(106.0)
    other = Observation(held("a"), changed_at=100.0)
    assert other.held_by_another("b", TIMING, 107.9)
    tenure.end(now=102.0)
    assert not tenure.may_write(100.0)
    assert tenure.fence_shuts == 0  # ended while writing: no pause


def test_a_late_renewal_pauses_the_writes_and_the_term_ends_only_at_the_lease_duration() -> None:
    """Renewed at 100: writing until 106, paused (fence shut, still the leader) until 108, when
    another replica may take the Lease, and the term is over."""
    tenure = Tenure(TIMING)
    assert tenure.state(100.0) is TermState.ENDED
    tenure.renewed(100.0, now=101.0)
    assert tenure.state(105.9) is TermState.WRITING
    assert tenure.state(106.0) is TermState.PAUSED and not tenure.may_write(106.0)
    assert tenure.state(107.9) is TermState.PAUSED
    assert tenure.state(108.0) is TermState.ENDED
    assert not tenure.may_write(108.0)


def test_a_renewal_that_succeeds_during_a_pause_opens_the_fence_and_counts_the_pause() -> None:
    tenure = Tenure(TIMING)
    tenure.renewed(100.0, now=100.5)
    # a renewal sent at 102 (the API server slow) is answered at 107: paused since 106
    assert not tenure.may_write(107.0)
    assert tenure.renewed(102.0, now=107.0)
    assert tenure.state(107.0) is TermState.WRITING and tenure.may_write(107.9)
    assert not tenure.may_write(108.0)  # 102 + renew_deadline: the time it was SENT counts
    assert tenure.fence_shuts == 1
    # a pause that ends the term counts too
    tenure.end(now=110.0)
    assert tenure.fence_shuts == 2 and tenure.state(110.0) is TermState.ENDED


def test_only_the_freshest_success_counts_and_never_one_sent_before_the_term_ended() -> None:
    tenure = Tenure(TIMING)
    tenure.renewed(100.0, now=100.5)
    epoch = tenure.epoch
    # three renewals in flight, sent at 102, 104, 106: the answer to 104 comes first
    assert tenure.renewed(104.0, now=107.0)
    assert not tenure.renewed(102.0, now=107.5)  # older: changes nothing
    assert tenure.renewed_at == 104.0
    assert tenure.renewed(106.0, now=108.0, epoch=epoch)
    assert tenure.renewed_at == 106.0
    # the term ends (another holder seen); an answer to a request of that term starts nothing
    tenure.end(now=109.0)
    assert not tenure.renewed(108.0, now=109.5, epoch=epoch)
    assert tenure.state(109.5) is TermState.ENDED
    # a claim sent in the new epoch does
    assert tenure.renewed(110.0, now=110.5, epoch=tenure.epoch)
    assert tenure.may_write(110.5)


def test_renewals_in_flight_fit_in_the_renew_deadline() -> None:
    """With the default timing, the renewals unanswered at once cover the renew deadline: a
    further one would go out when the fence has shut already."""
    default = LeaseTiming()
    assert RENEWALS_IN_FLIGHT * default.retry_period_s >= default.renew_deadline_s


@pytest.mark.parametrize("durations", [(8, 8, 2), (8, 6, 6), (8, 6, 0)])
def test_timings_that_break_the_fence_are_refused(durations: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period"):
        LeaseTiming(*durations)


def test_a_fractional_lease_duration_is_written_rounded_up() -> None:
    """The Lease holds whole seconds: rounding down would let another replica take it before
    this one's fence shut (renew deadline 8.2 s, lease 8.5 s written as 8)."""
    timing = LeaseTiming(lease_duration_s=8.5, renew_deadline_s=8.2, retry_period_s=2)
    record = claim(LeaseRecord(), "a", "http://a", timing, "t0")
    assert record.lease_duration_s == 9 >= timing.lease_duration_s
