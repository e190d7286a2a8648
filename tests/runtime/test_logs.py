"""Log files that a full disk refuses: lines are dropped and counted, nothing raises."""

from __future__ import annotations

import logging

import pytest

from kubeserve.runtime import logs


def test_a_log_on_a_full_disk_drops_and_counts_lines_and_never_raises(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``/dev/full`` refuses every write with ENOSPC, as a full disk does."""
    counted: list[int] = []
    logs.on_dropped(counted.append)
    before = logs.dropped_lines()
    logs._drops.warned_at = -logs.DROP_WARNING_INTERVAL_S  # not warned within the last minute
    handler = logs.RotatingLog("/dev/full", 0, 0)
    logger = logging.getLogger("kubeserve.test.full")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(5):
            logger.warning("line %d", i)
        handler.stream.write("two\nlines\n")  # an access-line batch goes straight to the stream
    finally:
        logger.removeHandler(handler)
        handler.close()
        logs._drops.listeners.remove(counted.append)
    assert logs.dropped_lines() - before == 7 and sum(counted) == 7
    assert "No space left on device" in capfd.readouterr().err  # the warning, once
