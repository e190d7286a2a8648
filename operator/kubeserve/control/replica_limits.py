"""What one replica may use of the machine, and how kubeserve says it was stopped for using more.

``ray_actor_options.memory`` is Ray's memory request of a replica; kubeserve also enforces it as a
limit (on Kubernetes the pod's ``resources.limits.memory``, locally its cgroup's memory limit). A
process limit keeps a fork loop inside its replica: Ray has no such option, so it is the
instance's (``kubeserve start --replica-max-processes``), the same for every replica.

The messages follow Ray's memory monitor: Ray kills a worker when its *node* runs low on memory
("Task was killed due to the node running low on memory", surfaced as ``OutOfMemoryError``);
here the replica went over its own limit, and the message names that limit and where it is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeserve.control.effective_config import EffectiveDeployment

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "ReplicaLimits",
    "out_of_memory_message",
    "replica_limits",
]

#: Processes (threads included: the kernel's pids limit counts tasks) one replica may run. An idle
#: replica runs about 20 and one with thread pools a few hundred at most, while a fork loop is
#: stopped well before the machine's process table (32,768 by default) fills up; it is CRI-O's
#: long-time default per container.
DEFAULT_MAX_PROCESSES = 1024


@dataclass(frozen=True)
class ReplicaLimits:
    """What a replica is held to: ``memory_bytes`` (``None``: no memory limit) and processes."""

    memory_bytes: int | None
    max_processes: int

    def describe(self) -> str:
        memory = (
            "no memory limit" if self.memory_bytes is None else f"memory {mib(self.memory_bytes)}"
        )
        return f"{memory}, at most {self.max_processes} processes"


def replica_limits(config: EffectiveDeployment, max_processes: int) -> ReplicaLimits:
    """The limits of a replica of a deployment running with ``config``."""
    memory = config.ray_actor_options.get("memory")
    return ReplicaLimits(int(memory) if memory else None, max_processes)


def mib(size: int) -> str:
    return f"{size / 1024**2:.0f} MiB" if size % 1024**2 == 0 else f"{size / 1024**2:.1f} MiB"


def out_of_memory_message(
    replica_id: str, limits: ReplicaLimits, enforced_by: str, peak_bytes: int | None
) -> str:
    """Why a replica the kernel killed for its memory stopped: Ray's ``OutOfMemoryError``, with
    the replica's own limit in place of the node's threshold (none set: the node ran low)."""
    if limits.memory_bytes is None:
        return (
            f"OutOfMemoryError: replica {replica_id} was killed due to the node running low on "
            f"memory ({enforced_by}); it has no memory limit of its own. The replica is "
            "restarted. Set ray_actor_options.memory to reserve and limit its memory."
        )
    used = "" if peak_bytes is None else f" (it used up to {mib(peak_bytes)})"
    return (
        f"OutOfMemoryError: replica {replica_id} was killed due to running out of its memory "
        f"limit of {mib(limits.memory_bytes)}{used}: ray_actor_options.memory = "
        f"{limits.memory_bytes} bytes, enforced by {enforced_by}. The replica is restarted. "
        "Raise ray_actor_options.memory or lower the replica's memory use (fewer "
        "max_ongoing_requests, smaller batches)."
    )
