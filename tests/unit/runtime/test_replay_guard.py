"""Signed requests to the admin server are answered once: the replay guard's window and bound."""

from __future__ import annotations

from kubeserve.runtime import channel

SECRET = b"s" * 32


def test_a_signature_is_accepted_once_and_forgotten_after_its_window() -> None:
    guard = channel.ReplayGuard()
    now = 1_000_000.0
    signature = channel.sign_request(SECRET, "GET", "/-/snapshot", now)
    assert guard.first_use(signature, now)
    assert not guard.first_use(signature, now + 1)
    assert not guard.first_use(signature, now + channel.SIGNATURE_MAX_SKEW_S - 1)
    # Once out of the window verify_request refuses it anyway; the guard has let it go.
    later = now + channel.SIGNATURE_MAX_SKEW_S + 1
    assert not channel.verify_request(SECRET, signature, "GET", "/-/snapshot", later)
    other = channel.sign_request(SECRET, "GET", "/-/snapshot", later)
    assert guard.first_use(other, later)
    assert len(guard._seen) == 1


def test_a_full_guard_refuses_new_signatures_rather_than_forget_live_ones() -> None:
    guard = channel.ReplayGuard(capacity=3)
    now = 5_000.0
    signatures = [channel.sign_request(SECRET, "GET", "/-/load", now) for _ in range(4)]
    assert [guard.first_use(s, now) for s in signatures] == [True, True, True, False]
    assert not guard.first_use(signatures[0], now)
