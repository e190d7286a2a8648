"""CPU cgroups (v1 ``cpu`` controller) for comparing serving processes under the same weights.

A pod's processes compete for the CPU as its cgroup, weighted by ``cpu.shares`` (the kubelet sets
them from the containers' CPU requests), inside the kubelet's cgroup root, which competes with
every process of the machine as one. A process started on the host competes as itself. So a load
generator on the host and a proxy in a pod are not loaded on equal terms: on a busy machine the
figure follows the cgroup weights, not the code. :func:`bench_groups` gives processes on the host
the weights the pods have (the same tree: one parent, one child per role), and :func:`read`
reports a cgroup's weight, quota and throttling.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: The parent of the bench's own cgroups, beside the node's ``/kubeserve-node``.
BENCH_GROUP = "kubeserve-bench"


@dataclass
class CpuGroup:
    """One cgroup's CPU settings and throttling so far."""

    path: str
    shares: int
    #: CFS quota per period in microseconds; -1: no limit
    quota_us: int
    period_us: int
    nr_periods: int
    nr_throttled: int
    throttled_ms: float


def available() -> str | None:
    """Why the v1 ``cpu`` hierarchy cannot be used here, or None."""
    if not (CPU_ROOT / "cpu.shares").exists():
        return f"no cgroup v1 cpu hierarchy at {CPU_ROOT} (cgroup v2 is not supported here)"
    return None


def group_of(pid: int) -> Path:
    """The ``cpu`` cgroup directory of process ``pid``."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    raise RuntimeError(f"process {pid} has no cpu cgroup (v1)")


def read(group: Path) -> CpuGroup:
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return CpuGroup(
        path=str(Path("/") / group.relative_to(CPU_ROOT)),
        shares=int((group / "cpu.shares").read_text()),
        quota_us=int((group / "cpu.cfs_quota_us").read_text()),
        period_us=int((group / "cpu.cfs_period_us").read_text()),
        nr_periods=int(stat.get("nr_periods", 0)),
        nr_throttled=int(stat.get("nr_throttled", 0)),
        throttled_ms=int(stat.get("throttled_time", 0)) / 1e6,
    )


def processes_of_pod(uid: str) -> list[int]:
    """The PIDs (on this machine) of a pod's containers, the sandbox's pause process left out:
    those whose cgroup path names ``pod<uid>`` (the kubelet's cgroupfs and systemd spellings)."""
    names = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if not any(n in (proc / "cgroup").read_text() for n in names):
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0] and not argv[0].endswith(b"/pause"):
                found.append(int(proc.name))
    return sorted(found)


@contextlib.contextmanager
def bench_groups(parent_shares: int, shares: Mapping[str, int]) -> Iterator[Path]:
    """``/kubeserve-bench`` with ``parent_shares`` and one child per name with its shares;
    yields the parent. At the end the processes left in them go back to the root cgroup and
    the cgroups are removed."""
    parent = CPU_ROOT / BENCH_GROUP
    _remove(parent)
    parent.mkdir()
    try:
        (parent / "cpu.shares").write_text(str(parent_shares))
        for name, value in shares.items():
            (parent / name).mkdir()
            (parent / name / "cpu.shares").write_text(str(value))
        yield parent
    finally:
        _remove(parent)


def join(group: Path, pids: Sequence[int]) -> None:
    """Move processes (all their threads) into ``group``; their children follow them."""
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))


def command_in(group: Path, program: str) -> list[str]:
    """An argv prefix that runs ``program`` (its arguments appended) inside ``group``."""
    return ["sh", "-c", 'echo $$ >"$0" && exec "$@"', str(group / "cgroup.procs"), program]


def _remove(group: Path) -> None:
    if not group.exists():
        return
    for child in sorted(group.rglob("cgroup.procs"), key=lambda p: -len(p.parts)):
        for pid in child.read_text().split():
            with contextlib.suppress(OSError):  # gone meanwhile
                (CPU_ROOT / "cgroup.procs").write_text(pid)
    for directory in sorted(
        (p.parent for p in group.rglob("cgroup.procs")), key=lambda p: -len(p.parts)
    ):
        deadline = time.monotonic() + 5
        while True:
            try:
                directory.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
