"""Replica limits without cgroups: the rlimits a replica process starts with."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from kubeserve.backends.local.limit_enforcement import RLIMIT, Enforcement
from kubeserve.control.replica_limits import ReplicaLimits

LIMITS = ReplicaLimits(memory_bytes=300 * 1024**2, max_processes=50)


def test_without_cgroups_a_replica_starts_under_rlimits() -> None:
    group = Enforcement(memory=None, pids=None).replica("r-1", LIMITS)
    assert group.dirs == [] and group.enforced_by == "RLIMIT_DATA"
    probe = (
        "import json, resource; print(json.dumps([resource.getrlimit(resource.RLIMIT_DATA),"
        " resource.getrlimit(resource.RLIMIT_NPROC)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        preexec_fn=group.enter,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    data, nproc = json.loads(out)
    assert data == [300 * 1024**2, 300 * 1024**2]
    ours = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    # per user: the user's tasks now plus the replica's share, never above what we may run
    assert nproc[0] != resource.RLIM_INFINITY
    assert ours == resource.RLIM_INFINITY or nproc[0] <= ours
    assert "memory: RLIMIT_DATA; processes: RLIMIT_NPROC" in group.describe()


def test_detect_names_what_this_machine_offers(tmp_path: Path) -> None:
    enforcement = Enforcement.detect(tmp_path)
    assert "memory by" in enforcement.describe() and "processes by" in enforcement.describe()
    if enforcement.memory is None:
        assert enforcement.memory_version == RLIMIT
