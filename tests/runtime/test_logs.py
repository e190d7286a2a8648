"""Log files: a full disk drops and counts lines and nothing raises; rotation; access lines in a
file of their own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
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


_ACCESS_FILE_PROGRAM = """
import logging, sys
from kubeserve.runtime import logs
settings = logs.LogSettings({"additional_log_standard_attrs": sys.argv[1:]})
logs.configure(settings, logs.ComponentLog("replica", "Echo", "Echo-1", "app", "Echo"),
               logs.output_from_environment())
logging.getLogger("user").warning("a record of the user's")
batched = logs.batched_access()
if batched is not None:
    batched.add("GET", "/echo", 200, 1.25, "rid-1")
    batched.write_lines("INFO 2026-11-28 10:00:00,000 proxy p -- GET /n 200 0.5ms\\n")
    batched.flush()
else:  # additional_log_standard_attrs: access lines are records, as the replica writes them
    access_record = {logs.ACCESS_RECORD: True}
    logging.getLogger(logs.ACCESS_LOGGER).info("GET /echo 200 1.2ms", extra=access_record)
logging.getLogger(logs.ACCESS_LOGGER).info("a ray.serve record that is no access line")
"""


@pytest.mark.parametrize("attrs", [[], ["process"]], ids=["batched", "as records"])
def test_access_lines_go_to_their_own_file_when_one_is_named(
    tmp_path: Path, attrs: list[str]
) -> None:
    """``KUBESERVE_ACCESS_LOG_FILE`` (pods on Kubernetes, ``spec.logs.accessLines: File``):
    access lines there, every other record where records go (here the process's log file)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "operator"),
        logs.LOG_FILE_ENV: str(tmp_path / "replica.log"),
        logs.ACCESS_LOG_FILE_ENV: str(tmp_path / "access.log"),
    }
    program = [sys.executable, "-c", _ACCESS_FILE_PROGRAM, *attrs]
    subprocess.run(program, env=env, check=True, timeout=60)
    access = (tmp_path / "access.log").read_text().splitlines()
    records = (tmp_path / "replica.log").read_text().splitlines()
    assert sorted(line.split(" -- ")[1] for line in access) == (
        ["GET /echo 200 1.2ms"] if attrs else ["GET /echo 200 1.2ms", "GET /n 200 0.5ms"]
    ), access
    assert all(" Echo Echo-1 " in line or " proxy p " in line for line in access)
    assert [line.split(" -- ")[1] for line in records] == [
        "a record of the user's",
        "a ray.serve record that is no access line",
    ], records
    assert (tmp_path / "access.log").stat().st_mode & 0o777 == 0o600
