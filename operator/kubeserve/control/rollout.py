"""How a deployment replaces its replicas: Ray's ``rolling_update_percentage`` and
``max_surge_percent``, and which replicas one reconcile pass starts and stops.

Pure decisions over plain data, the same for every backend. :class:`RolloutPolicy` states Ray
2.60's meaning of the two knobs (``DeploymentState._rollout_size`` and the surge path of
``deployment_state.py``) as two bounds on a deployment of ``target`` replicas:

* **surge** ``ceil(max_surge_percent * target / 100)``: replicas of the new version may start
  beyond the target by this many (replicas being stopped do not count);
* **unavailability**: with a surge (``max_surge_percent > 0``) none: an old replica stops only
  once the replicas serving stay at the target without it; without one,
  ``rolling_update_percentage`` of the target (at least one) at a time: old replicas stop first,
  and their replacements start in the room they left.

The Kubernetes backend hands the two bounds to each Deployment's ``strategy.rollingUpdate``
(:meth:`RolloutPolicy.bounds`); a backend that runs replicas itself asks :func:`rollout_step`.
Its invariants:

* a deployment with more replicas of its current version than its target stops the surplus,
  those not serving yet first, then the newest (:func:`stop_order`);
* a replica counts as serving a request only once it runs *and* proxies and handles had time to
  learn of it (``settled``); an old replica stops only while the settled new replicas and the
  running old ones stay at ``target - unavailability`` or above without it (an old replica still
  starting serves nothing: it always stops);
* new replicas start while the live ones (starting or running, of either version) stay at
  ``target + surge`` or below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self, TypeVar

__all__ = [
    "RAY_DEFAULT",
    "SIDE_BY_SIDE",
    "RolloutPolicy",
    "RolloutReplica",
    "RolloutStep",
    "rollout_step",
    "stop_order",
]


@dataclass(frozen=True)
class RolloutPolicy:
    """Ray's two knobs, validated by the schema: ``0 < rolling_update_percentage <= 1``,
    ``0 <= max_surge_percent <= 100``."""

    rolling_update_percentage: float
    max_surge_percent: int

    def batch(self, target: int) -> int:
        """Replicas replaced at a time without a surge (Ray's ``_rollout_size``)."""
        return max(int(self.rolling_update_percentage * target), 1)

    def surge(self, target: int) -> int:
        """Replicas allowed beyond ``target`` (an integer ceiling, as Ray's)."""
        return (self.max_surge_percent * target + 99) // 100

    def bounds(self, target: int) -> tuple[int, int]:
        """``(max_surge, max_unavailable)`` for ``target`` replicas, never both zero (a
        Deployment's ``strategy.rollingUpdate`` refuses that, and it would never progress)."""
        surge = self.surge(target)
        unavailable = 0 if self.max_surge_percent > 0 else self.batch(target)
        return surge, unavailable if surge or unavailable else 1

    @classmethod
    def given(
        cls, rolling_update_percentage: float | None, max_surge_percent: int | None, default: Self
    ) -> Self:
        """The policy a deployment config asks for: the backend's ``default`` when it sets
        neither knob, else Ray's default for the one it leaves unset (so that setting
        ``rolling_update_percentage`` alone means what it means in Ray, whatever the backend
        does by default)."""
        if rolling_update_percentage is None and max_surge_percent is None:
            return default
        return cls(
            RAY_DEFAULT.rolling_update_percentage
            if rolling_update_percentage is None
            else rolling_update_percentage,
            RAY_DEFAULT.max_surge_percent if max_surge_percent is None else max_surge_percent,
        )


#: Ray 2.60's defaults: a fifth of the replicas at a time, no surge.
RAY_DEFAULT = RolloutPolicy(0.2, 0)
#: Every missing replica of the new version at once, beside the old ones, which stop as new
#: ones serve in their place: nothing unavailable, twice the replicas at most.
SIDE_BY_SIDE = RolloutPolicy(1.0, 100)


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
    #: replicas of the current version to start now
    start: int = 0


R = TypeVar("R", bound=RolloutReplica)


def stop_order(replicas: Sequence[R]) -> list[R]:
    """Replicas to stop first: those not serving yet, then the newest."""
    return sorted(replicas, key=lambda r: (r.running, -r.start_time_s))


def rollout_step(
    current: Sequence[RolloutReplica],
    old: Sequence[RolloutReplica],
    target: int,
    policy: RolloutPolicy = SIDE_BY_SIDE,
) -> RolloutStep:
    """What to stop of the live (starting or running, healthy) replicas ``current`` (of the
    deployment's version) and ``old`` (of earlier versions) for ``target`` replicas, and how many
    of the current version to start, under ``policy`` (see the module)."""
    surplus = stop_order(current)[: max(0, len(current) - target)]
    stopping = {r.replica_id for r in surplus}
    kept = [r for r in current if r.replica_id not in stopping]
    serving = sum(1 for r in kept if r.running)
    settled = sum(1 for r in kept if r.running and r.settled)
    surge, unavailable = policy.bounds(target)
    available = settled + sum(1 for r in old if r.running)
    replaced: list[RolloutReplica] = []
    for replica in stop_order(old):
        if replica.running:
            if available - 1 < target - unavailable:
                break  # the rest run too (stop_order puts the starting ones first)
            available -= 1
        replaced.append(replica)
    live = len(kept) + len(old) - len(replaced)
    start = max(0, min(target - len(kept), target + surge - live))
    return RolloutStep([r.replica_id for r in (*surplus, *replaced)], serving, settled, start)
