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


#: Ray's switch (in a replica's environment) to leave ``CUDA_VISIBLE_DEVICES`` as inherited.
NOSET_CUDA_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set (as Ray reads it),
    else the NVIDIA driver's devices numbered from 0, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(n) for n in range(sum(1 for _ in Path("/proc/driver/nvidia/gpus").iterdir()))]
    except OSError:
        return []


def detect_gpus() -> int:
    """How many GPUs this process may use (:func:`visible_gpus`)."""
    return len(visible_gpus())


def process_gpus(pid: int) -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` a running process was started with (None: unset or
    unreadable): the devices an adopted replica holds."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
            value = entry.partition(b"=")[2].decode(errors="replace")
            return [d for d in value.split(",") if d]
    return None


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


def machine_memory() -> int:
    """The memory replicas may reserve when ``--memory`` is not given: the machine's, or this
    process's cgroup (v2) limit when lower; 0 when unknown."""
    total = memory_bytes()[1]
    try:
        limit = Path("/sys/fs/cgroup", _own_cgroup().lstrip("/"), "memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() and total else total


def _own_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise OSError("no cgroup v2 entry")


def gpu_names() -> list[str]:
    """The NVIDIA driver's device names (``Model:`` of each ``/proc/driver/nvidia/gpus/*``),
    in bus order; none without the driver."""
    names = []
    try:
        devices = sorted(Path("/proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return []
    for device in devices:
        try:
            for line in (device / "information").read_text().splitlines():
                name, _, value = line.partition(":")
                if name.strip() == "Model" and value.strip():
                    names.append(value.strip())
                    break
        except OSError:
            continue
    return names


def instance_resources(
    num_cpus: float | None,
    num_gpus: float | None,
    custom: Mapping[str, float] | None = None,
    memory: float | None = None,
) -> dict[str, float]:
    """The instance's resources: the flags when given, else what the machine has; ``custom``
    (``--resources``) besides. A node with NVIDIA GPUs also has ``accelerator_type:<model>`` of
    its first device, as Ray's raylet gives it (``--resources`` can add others)."""
    cpus = num_cpus if num_cpus is not None else max(os.cpu_count() or 1, MIN_DEFAULT_CPUS)
    gpus = num_gpus if num_gpus is not None else detect_gpus()
    resources: dict[str, float] = {}
    names = gpu_names() if gpus else []
    kind = placement.accelerator_type(names[0]) if names else None
    if kind:
        resources[placement.ACCELERATOR_PREFIX + kind] = 1.0
    resources.update(custom or {})
    memory = memory if memory is not None else machine_memory()
    return {**resources, "CPU": float(cpus), "GPU": float(gpus), "memory": float(memory)}


class Capacity:
    def __init__(
        self,
        total: Mapping[str, float],
        start_slots: int = DEFAULT_START_SLOTS,
        gpu_ids: list[str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.total = dict(total)
        #: the node's labels (``kubeserve start --labels``)
        self.labels = dict(labels or {})
        self.used = {kind: 0.0 for kind in ("CPU", "GPU", *self.total)}
        self.start_slots = start_slots
        self.starting = 0
        #: each GPU device's free share (1.0: nobody holds any of it), in device order
        self.gpu_free = {
            device: 1.0
            for device in placement.gpu_devices(
                self.total.get("GPU", 0.0), visible_gpus() if gpu_ids is None else gpu_ids
            )
        }

    def assign_gpus(self, need: float) -> list[str] | None:
        """Devices for a replica claiming ``need`` GPUs (see :func:`placement.assign_gpus`)."""
        return placement.assign_gpus(need, self.gpu_free)

    def hold_gpus(self, devices: list[str], need: float) -> None:
        """Devices a started (or adopted) replica holds: each whole one, or ``need`` of one."""
        share = need if need < 1.0 else 1.0
        for device in devices:
            if device in self.gpu_free:
                self.gpu_free[device] = max(0.0, self.gpu_free[device] - share)

    def free_gpus(self, devices: list[str], need: float) -> None:
        share = need if need < 1.0 else 1.0
        for device in devices:
            if device in self.gpu_free:
                self.gpu_free[device] = min(1.0, self.gpu_free[device] + share)

    def free(self) -> dict[str, float]:
        return {kind: self.total.get(kind, 0.0) - used for kind, used in self.used.items()}

    def free_start_slots(self) -> int:
        return self.start_slots - self.starting

    def memory_low(self) -> tuple[int, int] | None:
        """(available, total) bytes when memory is too low to start a replica, else ``None``."""
        available, total = memory_bytes()
        if total and available < placement.memory_reserve(total):
            return available, total
        return None

    def take(self, claim: Mapping[str, float]) -> None:
        for kind, need in claim.items():
            self.used[kind] = self.used.get(kind, 0.0) + need
        self.starting += 1

    def started(self) -> None:
        """A replica left STARTING (ready, or gone before it was)."""
        self.starting -= 1

    def release(self, claim: Mapping[str, float]) -> None:
        for kind, need in claim.items():
            self.used[kind] = max(0.0, self.used.get(kind, 0.0) - need)
