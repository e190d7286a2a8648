"""Which replicas a deployment stops in one reconcile pass: the surplus, and the replaced.

Pure decisions over plain data, the same for any backend that runs replicas itself. Invariants:

* a deployment with more replicas of its current version than its target stops the surplus,
  those not serving yet first, then the newest (:func:`stop_order`);
* a replica of an older version stops only once a current one serves in its place *and* proxies
  and handles had time to learn of it (``settled``): otherwise the old one could be the only
  replica they know of when it stops taking requests. So the old replicas kept are
  ``target - settled`` at least (never fewer than zero), and no more than there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["RolloutReplica", "RolloutStep", "rollout_step", "stop_order"]


@dataclass(frozen=True)
class RolloutReplica:
    replica_id: str
    #: answered its readiness probe (a starting replica has not)
    running: bool
    #: running long enough for proxies and handles to know of it
    settled: bool
    start_time_s: float


@dataclass(frozen=True)
class RolloutStep:
    #: replica ids to stop: the surplus of the current version, then the replaced
    stop: list[str]
    #: current replicas serving (running) once the surplus stops
    serving: int
    #: of those, how many are settled
    settled: int


R = TypeVar("R", bound=RolloutReplica)


def stop_order(replicas: Sequence[R]) -> list[R]:
    """Replicas to stop first: those not serving yet, then the newest."""
    return sorted(replicas, key=lambda r: (r.running, -r.start_time_s))


def rollout_step(
    current: Sequence[RolloutReplica], old: Sequence[RolloutReplica], target: int
) -> RolloutStep:
    """What to stop of the live (starting or running, healthy) replicas ``current`` (of the
    deployment's version) and ``old`` (of earlier versions) for ``target`` replicas."""
    surplus = stop_order(current)[: max(0, len(current) - target)]
    stopping = {r.replica_id for r in surplus}
    kept = [r for r in current if r.replica_id not in stopping]
    serving = sum(1 for r in kept if r.running)
    settled = sum(1 for r in kept if r.running and r.settled)
    replaced = stop_order(old)[: max(0, len(old) - max(0, target - settled))]
    return RolloutStep([r.replica_id for r in (*surplus, *replaced)], serving, settled)
