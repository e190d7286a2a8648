"""How ``kubeserve start`` holds each replica to its limits (``control.replica_limits``).

Chosen once per instance (:meth:`Enforcement.detect`), per resource:

* **cgroup v2**, where this process's cgroup may have children with the ``memory`` and ``pids``
  controllers: ``memory.max`` (``memory.swap.max`` 0) and ``pids.max``;
* **cgroup v1**, per hierarchy mounted and writable: ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap is accounted) and ``pids.max``;
* otherwise **rlimits**, set in the replica before it runs anything: ``RLIMIT_DATA`` (an
  allocation beyond the limit fails with ``MemoryError`` instead of the replica being killed)
  and ``RLIMIT_NPROC`` (per user, not per replica, and not enforced for root: weaker, and said so).

Each replica gets its own cgroup, ``<this process's cgroup>/kubeserve-<instance>/<replica id>``,
nested under the cgroup ``kubeserve start`` runs in (so whatever limits that one has still hold),
entered by the replica process between fork and exec, so everything it starts is in it too. The
kernel kills a replica over its memory (the OOM killer, within the cgroup); :meth:`ReplicaCgroup
.out_of_memory` tells it from another death. A replica's cgroup outlives ``kubeserve start``
with the replica (the data plane outlives the controller) and is removed once the replica and
everything it started are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import resource
import signal
from dataclasses import dataclass, field
from pathlib import Path

from kubeserve.control.replica_limits import ReplicaLimits

log = logging.getLogger(__name__)

CGROUP_V2, CGROUP_V1, RLIMIT = "cgroup v2", "cgroup v1", "rlimit"
_CGROUP_FS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Enforcement:
    """Where the replicas' cgroups of one instance live: ``memory`` and ``pids`` are the
    instance's directory in the hierarchy holding that controller (the same directory under
    cgroup v2), ``None`` where the controller cannot be used (rlimits instead)."""

    memory: Path | None
    pids: Path | None
    memory_version: str = RLIMIT
    pids_version: str = RLIMIT

    @classmethod
    def detect(cls, state_dir: Path) -> Enforcement:
        """What this machine offers this process (nothing is created until a replica starts)."""
        name = "kubeserve-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
        own = _own_cgroups()
        found: dict[str, tuple[Path, str]] = {}
        unified = own.get("")
        if unified is not None and _v2_delegates(unified):
            found = {c: (unified / name, CGROUP_V2) for c in ("memory", "pids")}
        for controller in ("memory", "pids"):
            path = own.get(controller)
            if controller not in found and path is not None and os.access(path, os.W_OK):
                found[controller] = (path / name, CGROUP_V1)
        memory, pids = found.get("memory"), found.get("pids")
        return cls(
            memory=memory[0] if memory else None,
            pids=pids[0] if pids else None,
            memory_version=memory[1] if memory else RLIMIT,
            pids_version=pids[1] if pids else RLIMIT,
        )

    def describe(self) -> str:
        memory = {
            CGROUP_V2: "cgroup v2 memory.max",
            CGROUP_V1: "cgroup v1 memory.limit_in_bytes",
            RLIMIT: "RLIMIT_DATA (allocations beyond it fail with MemoryError)",
        }[self.memory_version]
        pids = {
            CGROUP_V2: "cgroup v2 pids.max",
            CGROUP_V1: "cgroup v1 pids.max",
            RLIMIT: "RLIMIT_NPROC (per user; not enforced for root)",
        }[self.pids_version]
        return f"memory by {memory}, processes by {pids}"

    def replica(self, replica_id: str, limits: ReplicaLimits) -> ReplicaCgroup:
        """The cgroup(s) of one replica, created with ``limits`` written (again, for a replica
        adopted from an earlier run); a controller that refuses falls back to rlimits."""
        group = ReplicaCgroup(replica_id, limits, self)
        group.create()
        return group

    def sweep(self, keep: set[str]) -> None:
        """Remove the empty cgroups of replicas an earlier run left (not in ``keep``)."""
        for base in {self.memory, self.pids} - {None}:
            assert base is not None
            with contextlib.suppress(OSError):
                for child in base.iterdir():
                    if child.is_dir() and child.name not in keep:
                        with contextlib.suppress(OSError):
                            child.rmdir()


@dataclass
class ReplicaCgroup:
    """One replica's cgroups (or rlimits); :meth:`enter` runs in the replica before exec."""

    replica_id: str
    limits: ReplicaLimits
    enforcement: Enforcement
    #: the replica's directories, memory's first (one under cgroup v2)
    dirs: list[Path] = field(default_factory=list)
    memory_dir: Path | None = None
    pids_dir: Path | None = None
    #: the OOM kills counted in the memory cgroup when the replica started
    _oom_kills_before: int = 0

    def create(self) -> None:
        enforcement, limits = self.enforcement, self.limits
        if enforcement.memory is not None and limits.memory_bytes is not None:
            self.memory_dir = self._make(enforcement.memory, enforcement.memory_version, "memory")
        if enforcement.pids is not None:
            self.pids_dir = self._make(enforcement.pids, enforcement.pids_version, "pids")
        self.dirs = list(dict.fromkeys(d for d in (self.memory_dir, self.pids_dir) if d))
        self._oom_kills_before = self._oom_kills()

    def _make(self, base: Path, version: str, controller: str) -> Path | None:
        path = base / self.replica_id
        try:
            path.mkdir(parents=True, exist_ok=True)
            if controller == "memory":
                _write_memory_limit(path, version, self.limits.memory_bytes or 0)
            else:
                (path / "pids.max").write_text(str(self.limits.max_processes))
        except OSError as exc:
            log.warning(
                "replica %s: cannot use the %s cgroup %s (%s); rlimits instead",
                self.replica_id, controller, path, exc,
            )  # fmt: skip
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return path

    def describe(self) -> str:
        """The limits and what enforces each, for the replica's log line."""
        memory = "cgroup " + str(self.memory_dir) if self.memory_dir else "RLIMIT_DATA"
        pids = "cgroup " + str(self.pids_dir) if self.pids_dir else "RLIMIT_NPROC"
        if self.limits.memory_bytes is None:
            memory = "-"
        return f"{self.limits.describe()} (memory: {memory}; processes: {pids})"

    @property
    def enforced_by(self) -> str:
        """What holds the replica to its memory limit, as the death message names it."""
        if self.memory_dir is None:
            return "RLIMIT_DATA"
        file = (
            "memory.max"
            if self.enforcement.memory_version == CGROUP_V2
            else ("memory.limit_in_bytes")
        )
        return f"the kernel ({self.enforcement.memory_version} {file} of {self.memory_dir})"

    def enter(self) -> None:
        """Runs in the replica process between fork and exec: join the cgroups, or set the
        rlimits of what has none. Nothing here may raise (the start would fail obscurely)."""
        for path in self.dirs:
            with contextlib.suppress(OSError), open(path / "cgroup.procs", "w") as procs:
                procs.write("0")  # "0": the writing process itself
        with contextlib.suppress(OSError, ValueError):
            if self.memory_dir is None and self.limits.memory_bytes is not None:
                size = self.limits.memory_bytes
                resource.setrlimit(resource.RLIMIT_DATA, (size, size))
            if self.pids_dir is None:  # per user: what the user runs now, plus the replica's
                wanted = _tasks_of(os.getuid()) + self.limits.max_processes
                soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
                if hard != resource.RLIM_INFINITY:
                    wanted = min(wanted, hard)
                if soft == resource.RLIM_INFINITY or wanted < soft:
                    resource.setrlimit(resource.RLIMIT_NPROC, (wanted, hard))

    def _oom_kills(self) -> int:
        if self.memory_dir is None:
            return 0
        name = (
            "memory.events"
            if self.enforcement.memory_version == CGROUP_V2
            else ("memory.oom_control")
        )
        return _counter(self.memory_dir / name, "oom_kill")

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the replica for its memory since it started."""
        return self._oom_kills() > self._oom_kills_before

    def peak_memory(self) -> int | None:
        if self.memory_dir is None:
            return None
        name = (
            "memory.peak"
            if self.enforcement.memory_version == CGROUP_V2
            else ("memory.max_usage_in_bytes")
        )
        try:
            return int((self.memory_dir / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def processes(self) -> list[int]:
        """Every process left in the replica's cgroups."""
        pids: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return sorted(pids)

    async def release(self) -> None:
        """Kill whatever the replica left in its cgroups (processes that left its process group
        too) and remove them; the replica itself has exited."""
        for _ in range(100):  # a fork loop may still be forking: until none is left
            left = self.processes()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.02)
        for path in self.dirs:
            for _ in range(50):  # killed processes leave the cgroup once reaped
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    await asyncio.sleep(0.02)


def _write_memory_limit(path: Path, version: str, size: int) -> None:
    if version == CGROUP_V2:
        (path / "memory.max").write_text(str(size))
        with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(size))
    memsw = path / "memory.memsw.limit_in_bytes"
    if memsw.exists():  # swap is accounted: memory and swap together, the same
        memsw.write_text(str(size))


def _counter(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``...), 0 if absent."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _tasks_of(uid: int) -> int:
    """The threads of every process of ``uid`` (what ``RLIMIT_NPROC`` counts)."""
    count = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def _own_cgroups() -> dict[str, Path]:
    """This process's cgroup directory per v1 controller (``memory``, ``pids``) and for the
    unified hierarchy (key ``""``), where mounted."""
    mounts: dict[str, tuple[str, Path]] = {}  # controller or "" -> (mount root, mount point)
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3].split(",")
            root, point = fields[3], Path(fields[4])
            if fstype == "cgroup2":
                mounts.setdefault("", (root, point))
            elif fstype == "cgroup":
                for controller in ("memory", "pids"):
                    if controller in options:
                        mounts.setdefault(controller, (root, point))
    own: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for key in controllers.split(",") if controllers else [""]:
                if key in mounts:
                    root, point = mounts[key]
                    relative = os.path.relpath(path, root) if path.startswith(root) else path
                    own[key] = (point / relative.lstrip("/")).resolve()
    return own


def _v2_delegates(cgroup: Path) -> bool:
    """Whether children of ``cgroup`` (cgroup v2) can have the memory and pids controllers: they
    are enabled for its children already, or can be (only in a cgroup without processes of its
    own, by the "no internal processes" rule, or at the root)."""
    try:
        available = set((cgroup / "cgroup.controllers").read_text().split())
        enabled = set((cgroup / "cgroup.subtree_control").read_text().split())
    except OSError:
        return False
    wanted = {"memory", "pids"}
    if not wanted <= available or not os.access(cgroup, os.W_OK):
        return False
    if wanted <= enabled:
        return True
    try:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
    except OSError:
        return False
    return True
