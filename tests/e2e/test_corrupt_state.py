"""A ``kubeserve.db`` that is not a database: named, copied aside, and ``--reset-state`` starts
empty (the way the error message and the README give)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.common import ROOT, free_port
from support.kubeserve_start import Kubeserve

GARBAGE = b"this is not an SQLite database\n" * 200


def test_a_corrupt_database_is_named_kept_aside_and_reset_state_starts_empty(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    database = state / "kubeserve.db"
    database.write_bytes(GARBAGE)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    command = [sys.executable, "-m", "kubeserve.cli", "start", "--state-dir", str(state)]
    command += ["--dashboard-port", str(free_port()), "--http-port", str(free_port())]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    (copy,) = state.glob("kubeserve.db.corrupt-*")
    error = refused.stderr.strip()
    assert refused.returncode == 1, refused
    assert "Traceback" not in error, error
    assert len(error.splitlines()) == 1, error  # one paragraph
    assert str(database) in error and str(copy) in error and "--reset-state" in error, error
    assert copy.read_bytes() == GARBAGE and database.read_bytes() == GARBAGE  # nothing changed
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and list(state.glob("kubeserve.db.corrupt-*")) == [copy]

    ks = Kubeserve(state, args=("--reset-state",))
    ks.start()
    try:
        assert ks.details()["applications"] == {}
        (aside,) = state.glob("kubeserve.db.reset-*")
        assert aside.read_bytes() == GARBAGE
        app = {"name": "hello", "route_prefix": "/", "import_path": "ks_echo_app:function_app"}
        assert ks.put([app])[0] == 200
        ks.wait_app("hello")
    finally:
        ks.stop()
    ks = Kubeserve(state)  # and the new database is used from then on, without the flag
    ks.start()
    try:
        assert "hello" in ks.details()["applications"]
    finally:
        ks.stop()
