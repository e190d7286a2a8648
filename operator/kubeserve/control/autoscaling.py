"""Autoscaling decisions: how many replicas a deployment should run, as pure functions.

The rules are Ray Serve 2.60's default policy, so an ``autoscaling_config`` written for Ray means
the same thing here:

* *load* is the total of requests running on the replicas plus requests queued at callers,
  aggregated over the last ``look_back_period_s`` with ``aggregation_function`` (``mean`` is a
  time-weighted mean of the summed step function; ``max``/``min`` its peak or trough);
* the wanted count is ``load / target_ongoing_requests``, moved from the current count by
  ``upscaling_factor`` or ``downscaling_factor`` (a downscale the factor would round away still
  removes one replica);
* a change takes effect only once it has been wanted continuously for ``upscale_delay_s`` or
  ``downscale_delay_s`` (``downscale_to_zero_delay_s`` for 1 -> 0, when set); a change of
  direction restarts the clock;
* from zero replicas, any load starts replicas at once (no delay);
* the result is clipped to ``[min_replicas, max_replicas]``, both scaled by ``target_capacity``.

Who owns what: callers of :func:`decide` keep the :class:`PolicyState` between calls (one per
deployment) and the current target; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from kubeserve.schema.config import AutoscalingConfig as AutoscalingConfigSchema

__all__ = [
    "AUTOSCALING_DEFAULTS",
    "AUTO_NUM_REPLICAS_DEFAULTS",
    "AutoscalingConfig",
    "CapacityTracker",
    "Decision",
    "Direction",
    "PolicyState",
    "Sample",
    "capacity_adjusted",
    "check_policy_answer",
    "decide",
    "initial_target",
    "is_cold_start",
    "target_capacity_direction",
    "total_requests",
]

Aggregation = Literal["mean", "max", "min"]
Direction = Literal["UP", "DOWN"]

#: Ray Serve 2.60's ``AutoscalingConfig`` defaults: the schema model's, stated there only (its
#: ``policy`` is the default one unless given, so an effective config carries it only when given).
AUTOSCALING_DEFAULTS: Mapping[str, Any] = {
    name: info.default
    for name, info in AutoscalingConfigSchema.model_fields.items()
    if name != "policy"
}

#: What ``num_replicas: "auto"`` sets under the fields the user gives (Ray 2.60's
#: ``AutoscalingConfig.default()``).
AUTO_NUM_REPLICAS_DEFAULTS: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 100,
    "target_ongoing_requests": 2.0,
}

#: Delays are compared with this slack, so 400 s measured as 399.9999999 still counts.
_DELAY_EPS_S = 1e-6


@dataclass(frozen=True)
class AutoscalingConfig:
    """An ``autoscaling_config`` with every field resolved (deprecated smoothing factors folded
    into the two scaling factors, as Ray does); built by :meth:`from_mapping`, which fills
    :data:`AUTOSCALING_DEFAULTS`."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int | None
    target_ongoing_requests: float
    metrics_interval_s: float
    look_back_period_s: float
    upscale_delay_s: float
    downscale_delay_s: float
    downscale_to_zero_delay_s: float | None
    upscaling_factor: float
    downscaling_factor: float
    aggregation_function: Aggregation

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> AutoscalingConfig:
        """From an effective ``autoscaling_config`` (missing fields take Ray's defaults)."""
        c = {**AUTOSCALING_DEFAULTS, **raw}
        smoothing = float(c["smoothing_factor"] or 1.0)
        up = c["upscaling_factor"] or c["upscale_smoothing_factor"] or smoothing
        down = c["downscaling_factor"] or c["downscale_smoothing_factor"] or smoothing
        aggregation = str(c["aggregation_function"]).lower()
        if aggregation not in ("mean", "max", "min"):
            raise ValueError(f"unknown aggregation_function {aggregation!r}")
        return cls(
            min_replicas=int(c["min_replicas"]),
            max_replicas=int(c["max_replicas"]),
            initial_replicas=None if c["initial_replicas"] is None else int(c["initial_replicas"]),
            target_ongoing_requests=float(c["target_ongoing_requests"] or 2.0),
            metrics_interval_s=float(c["metrics_interval_s"]),
            look_back_period_s=float(c["look_back_period_s"]),
            upscale_delay_s=float(c["upscale_delay_s"]),
            downscale_delay_s=float(c["downscale_delay_s"]),
            downscale_to_zero_delay_s=(
                None
                if c["downscale_to_zero_delay_s"] is None
                else float(c["downscale_to_zero_delay_s"])
            ),
            upscaling_factor=float(up),
            downscaling_factor=float(down),
            aggregation_function=aggregation,  # type: ignore[arg-type]  # checked above
        )


# --------------------------------------------------------------------------- target_capacity


def capacity_adjusted(num_replicas: int, target_capacity: float | None) -> int:
    """``num_replicas`` scaled by ``target_capacity`` percent, rounded half up.

    Zero only when the capacity or the count is zero; otherwise at least one replica.
    """
    if target_capacity is None or target_capacity == 100:
        return num_replicas
    if target_capacity == 0 or num_replicas == 0:
        return 0
    scaled = (
        Decimal(num_replicas) * Decimal(str(target_capacity)) / Decimal(100)
    ).to_integral_value(rounding=ROUND_HALF_UP)
    return max(1, int(scaled))


def target_capacity_direction(
    previous_apps: set[str] | None,
    previous_capacity: float | None,
    new_apps: set[str],
    new_capacity: float | None,
    previous_direction: Direction | None,
) -> Direction | None:
    """Whether a config's ``target_capacity`` scales the instance up or down (Ray 2.60).

    Same applications: a lower (or newly set) capacity is ``DOWN``, a higher one ``UP``, an unset
    one none, an unchanged one keeps the direction. Other applications with a capacity: ``UP``.
    While scaling ``UP`` the lower bound of autoscaling deployments is ``initial_replicas``.
    """
    if previous_apps is not None and previous_apps == new_apps:
        if previous_capacity == new_capacity:
            return previous_direction
        if new_capacity is None:
            return None
        if previous_capacity is None or new_capacity < previous_capacity:
            return "DOWN"
        return "UP"
    return "UP" if new_capacity is not None else None


class CapacityTracker:
    """Remembers the last config's applications and ``target_capacity`` to tell the direction of
    the next (:func:`target_capacity_direction`); one per serving layer."""

    def __init__(self) -> None:
        self._seen: tuple[frozenset[str] | None, float | None] = (None, None)
        self._direction: Direction | None = None

    def update(
        self, apps: Iterable[str], capacity: float | None
    ) -> tuple[float | None, Direction | None]:
        """The capacity to apply and its direction, for a config of ``apps`` with ``capacity``."""
        seen = (frozenset(apps), capacity)
        if seen != self._seen:
            previous_apps, previous_capacity = self._seen
            self._direction = target_capacity_direction(
                None if previous_apps is None else set(previous_apps),
                previous_capacity,
                set(seen[0]),
                capacity,
                self._direction,
            )
            self._seen = seen
        return capacity, self._direction


def bounds(
    config: AutoscalingConfig, target_capacity: float | None, direction: Direction | None
) -> tuple[int, int]:
    """``(lowest, highest)`` replica count the autoscaler may choose, capacity applied."""
    if config.initial_replicas is not None and direction == "UP":
        low = capacity_adjusted(config.initial_replicas, target_capacity)
    else:
        low = capacity_adjusted(config.min_replicas, target_capacity)
    return low, capacity_adjusted(config.max_replicas, target_capacity)


def initial_target(
    config: AutoscalingConfig, target_capacity: float | None, direction: Direction | None
) -> int:
    """The count a newly deployed autoscaling deployment starts at (``initial_replicas``, else
    ``min_replicas``), within the bounds."""
    start = config.initial_replicas if config.initial_replicas is not None else config.min_replicas
    low, high = bounds(config, target_capacity, direction)
    return max(low, min(high, start))


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Sample:
    """One reading of a gauge (requests running or queued at one source) at ``timestamp``."""

    timestamp: float
    value: float


def _merged_total(series: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Sum gauges into one step function: each source holds its last value until its next."""
    events = sorted((s.timestamp, i, s.value) for i, one in enumerate(series) for s in one)
    current = [0.0] * len(series)
    merged: list[Sample] = []
    for timestamp, i, value in events:
        current[i] = value
        total = sum(current)
        if merged and merged[-1].timestamp == timestamp:
            merged[-1] = Sample(timestamp, total)
        else:
            merged.append(Sample(timestamp, total))
    return merged


def total_requests(
    series: Sequence[Sequence[Sample]],
    now: float,
    look_back_period_s: float,
    aggregation: Aggregation,
) -> float:
    """The load the policy acts on: every source's gauge summed, aggregated over the window.

    ``series`` holds one time-ordered list per source (a replica's running requests, a caller's
    queued requests). Readings older than ``now - look_back_period_s`` are dropped (a source that
    stopped reporting stops counting). The window opens once every source has reported (a source
    is not 0 before its first reading, just unknown) and closes at ``now``; each reading holds
    until the source's next. No readings at all is no load.
    """
    start = now - look_back_period_s
    trimmed = [kept for one in series if (kept := [s for s in one if start <= s.timestamp <= now])]
    if not trimmed:
        return 0.0
    opens = max(one[0].timestamp for one in trimmed)
    merged = _merged_total(trimmed)
    held = [s for s in merged if s.timestamp < opens]
    window = ([Sample(opens, held[-1].value)] if held else []) + [
        s for s in merged if s.timestamp >= opens
    ]
    if aggregation == "max":
        return max(s.value for s in window)
    if aggregation == "min":
        return min(s.value for s in window)
    if now <= opens:
        return window[-1].value
    area = 0.0
    for here, after in zip(window, [*window[1:], Sample(now, 0.0)], strict=True):
        area += here.value * (after.timestamp - here.timestamp)
    return area / (now - opens)


# --------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class PolicyState:
    """What the delay rule remembers between decisions: the direction wanted and since when."""

    direction: Literal[-1, 0, 1] = 0
    since: float | None = None


@dataclass(frozen=True)
class Decision:
    """The target to run, the state for the next call, and why (for status and logs)."""

    target: int
    state: PolicyState
    #: a sentence when the target changes, else ""
    reason: str = ""
    #: what the policy wanted before delays and bounds (reported as a metric)
    desired: float = 0.0


def _apply_factors(desired: float, running: int, config: AutoscalingConfig) -> int:
    if running == 0:
        return math.ceil(desired)
    delta = desired - running
    factor = config.upscaling_factor if delta > 0 else config.downscaling_factor
    scaled = math.ceil(running + factor * delta)
    if math.ceil(desired) < running and scaled == running:
        scaled -= 1  # a factor must not stall a downscale forever
    return scaled


def _apply_delays(
    wanted: int, target: int, config: AutoscalingConfig, state: PolicyState, now: float
) -> tuple[int, PolicyState]:
    if wanted == target:
        return target, PolicyState()
    direction: Literal[-1, 1] = 1 if wanted > target else -1
    since = state.since if state.direction == direction and state.since is not None else now
    if direction == 1:
        delay = config.upscale_delay_s
    elif target == 1 and config.downscale_to_zero_delay_s is not None:
        delay = config.downscale_to_zero_delay_s
    else:
        delay = config.downscale_delay_s
    if direction == -1 and target != 1:
        wanted = max(1, wanted)  # only 1 -> 0 reaches zero
    if now - since + _DELAY_EPS_S >= delay:
        return wanted, PolicyState()
    return target, PolicyState(direction, since)


def decide(
    config: AutoscalingConfig,
    *,
    running: int,
    target: int,
    load: float,
    state: PolicyState,
    now: float,
    target_capacity: float | None = None,
    capacity_direction: Direction | None = None,
    desired: float | None = None,
) -> Decision:
    """The replica count to run next (Ray 2.60's default policy; see the module docstring).

    ``running`` is how many replicas serve now, ``target`` the count currently aimed at, ``load``
    the :func:`total_requests` of the window. ``desired`` is a custom policy's answer: it takes
    the default policy's place, and Ray 2.60's wrapper of custom policies applies to it as to
    the default's (cold start, scaling factors, delays, bounds).
    """
    low, high = bounds(config, target_capacity, capacity_direction)
    if is_cold_start(running, load):  # no delay
        wanted = max(math.ceil(config.upscaling_factor), target)
        new_state = state
        desired = float(wanted)
    else:
        if desired is None:
            desired = float(target) if running == 0 else load / config.target_ongoing_requests
        scaled = _apply_factors(desired, running, config)
        if running == 0 and scaled > 0:
            wanted, new_state = scaled, state
        else:
            wanted, new_state = _apply_delays(max(0, scaled), target, config, state, now)
    final = max(low, min(high, wanted))
    return Decision(final, new_state, _reason(target, final, load, running), desired)


def is_cold_start(running: int, load: float) -> bool:
    """Nothing serves and requests wait: replicas start at once, no policy asked (as in Ray)."""
    return running == 0 and load > 0


def check_policy_answer(answer: object) -> float:
    """A custom policy's replica count, or :class:`ValueError` saying what is wrong with it.

    Ray takes an int or a float (rounded up); anything else, a negative or a non-finite number,
    is refused here so the count stays as it was.
    """
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        raise ValueError(
            f"the policy returned {type(answer).__name__} {answer!r} as the replica count; "
            "expected an int or a float"
        )
    if not math.isfinite(answer) or answer < 0:
        raise ValueError(f"the policy returned {answer!r} replicas; expected a number >= 0")
    return float(answer)


def _reason(old: int, new: int, load: float, running: int) -> str:
    if new == old:
        return ""
    verb = "Upscaling" if new > old else "Downscaling"
    return (
        f"{verb} from {old} to {new} replicas: {load:.2f} ongoing and queued requests on "
        f"{running} running replicas."
    )
