from kubeserve.control.backoff import RESTART_BASE_S, RESTART_CAP_S, restart_delay


def test_no_failure_no_wait() -> None:
    assert restart_delay(0) == 0.0


def test_the_wait_doubles_with_each_failure() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [
        RESTART_BASE_S,
        2 * RESTART_BASE_S,
        4 * RESTART_BASE_S,
        8 * RESTART_BASE_S,
    ]


def test_the_wait_is_capped_however_long_the_streak() -> None:
    assert restart_delay(12) == RESTART_CAP_S
    assert restart_delay(10_000) == RESTART_CAP_S
