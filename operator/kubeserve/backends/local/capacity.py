"""The resources of a ``kubeserve start`` instance and who holds them (see
:mod:`kubeserve.control.placement` for the rules).

Owned by the controller, shared by every deployment through the replica context. Invariant: a
replica holds its claim from the moment it is started until its process is gone (stopping
replicas still hold theirs), and a start slot from its start until it is ready or gone. One
asyncio loop mutates it, so no locking.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubeserve.control import placement

#: ``kubeserve start``'s CPU count when ``--num-cpus`` is not given: the machine's, but at least
#: this. A local replica is a process sharing the cores with others (mostly waiting for requests),
#: and with Ray Serve's default of one CPU per replica a small machine (the 2-core VMs of CI)
#: could otherwise not run the examples; the count still bounds how many replicas run.
MIN_DEFAULT_CPUS = 16
#: Replicas of the whole instance starting (importing user code) at once.
DEFAULT_START_SLOTS = 8


def detect_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set (as Ray reads it), else the
    NVIDIA driver's device list, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    devices = Path("/proc/driver/nvidia/gpus")
    try:
        return sum(1 for _ in devices.iterdir())
    except OSError:
        return 0


def memory_bytes() -> tuple[int, int]:
    """(available, total) memory of the machine from ``/proc/meminfo``; (0, 0) when unknown."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return fields.get("MemAvailable", 0), fields.get("MemTotal", 0)


def instance_resources(num_cpus: float | None, num_gpus: float | None) -> dict[str, float]:
    """The instance's resources: the flags when given, else what the machine has."""
    cpus = num_cpus if num_cpus is not None else max(os.cpu_count() or 1, MIN_DEFAULT_CPUS)
    gpus = num_gpus if num_gpus is not None else detect_gpus()
    return {"CPU": float(cpus), "GPU": float(gpus)}


class Capacity:
    def __init__(self, total: Mapping[str, float], start_slots: int = DEFAULT_START_SLOTS) -> None:
        self.total = dict(total)
        self.used = {kind: 0.0 for kind in placement.ENFORCED}
        self.start_slots = start_slots
        self.starting = 0

    def free(self) -> dict[str, float]:
        return {kind: self.total.get(kind, 0.0) - self.used[kind] for kind in placement.ENFORCED}

    def free_start_slots(self) -> int:
        return self.start_slots - self.starting

    def memory_low(self) -> tuple[int, int] | None:
        """(available, total) bytes when memory is too low to start a replica, else ``None``."""
        available, total = memory_bytes()
        if total and available < placement.memory_reserve(total):
            return available, total
        return None

    def take(self, claim: Mapping[str, float]) -> None:
        for kind in placement.ENFORCED:
            self.used[kind] += claim.get(kind, 0.0)
        self.starting += 1

    def started(self) -> None:
        """A replica left STARTING (ready, or gone before it was)."""
        self.starting -= 1

    def release(self, claim: Mapping[str, float]) -> None:
        for kind in placement.ENFORCED:
            self.used[kind] = max(0.0, self.used[kind] - claim.get(kind, 0.0))
