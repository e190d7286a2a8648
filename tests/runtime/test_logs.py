"""Log files that a full disk refuses: lines are dropped and counted, nothing raises."""

from __future__ import annotations

import logging
from pathlib import Path

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


def test_a_log_file_rotates_at_its_size_keeping_its_backups(tmp_path: Path) -> None:
    """As ``logging.handlers.RotatingFileHandler`` rotates (which a process does not import):
    no file past the size, the newest lines in ``path``, then ``path.1``, ``path.2``."""
    path = tmp_path / "proxy.log"
    handler = logs.RotatingLog(str(path), 100, 2)
    logger = logging.getLogger("kubeserve.test.rotating")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(20):
            logger.warning("line %02d %s", i, "x" * 20)  # 29 bytes a line: 3 to a file
    finally:
        logger.removeHandler(handler)
        handler.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["proxy.log", "proxy.log.1", "proxy.log.2"]
    assert all((tmp_path / name).stat().st_size < 100 for name in files)
    assert path.read_text().splitlines()[-1].startswith("line 19")
    assert (tmp_path / "proxy.log.1").read_text().splitlines()[-1].startswith("line 17")
    assert (tmp_path / "proxy.log").stat().st_mode & 0o777 == 0o600


def test_a_log_that_is_no_regular_file_never_rotates() -> None:
    handler = logs.RotatingLog("/dev/null", 10, 2)
    logger = logging.getLogger("kubeserve.test.devnull")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(5):
            logger.warning("a line longer than ten bytes %d", i)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert not Path("/dev/null.1").exists()
