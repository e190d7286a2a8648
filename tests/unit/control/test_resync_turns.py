from __future__ import annotations

import pytest

from kubeserve.control.resync_turns import ResyncTurns


def test_each_key_runs_one_full_pass_in_every_resyncs_exactly() -> None:
    turns = ResyncTurns(10)
    keys = [f"ServeApplication/ns/app-{i}" for i in range(200)]
    full = {key: [turns.full(key) for _ in range(30)] for key in keys}
    # one in ten, every key alike (a count reset by each pass once gave some keys a full pass
    # at every resync and others one in ten)
    assert {sum(runs) for runs in full.values()} == {3}
    for runs in full.values():
        first = runs.index(True)
        assert first < 10 and runs[first + 10] and runs[first + 20]


def test_keys_created_together_spread_their_full_passes() -> None:
    turns = ResyncTurns(10)
    keys = [f"ServeApplication/ns/app-{i}" for i in range(200)]
    first_sweep = [turns.full(key) for key in keys]
    assert 5 <= sum(first_sweep) <= 40  # about a tenth, not all or none


def test_a_forgotten_key_starts_again_at_its_phase() -> None:
    turns = ResyncTurns(10)
    before = [turns.full("k") for _ in range(10)]
    turns.forget("k")
    assert len(turns) == 0
    assert [turns.full("k") for _ in range(10)] == before


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every must be at least 1"):
        ResyncTurns(0)
