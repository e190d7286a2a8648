"""The autoscaling of one deployment over time: its load history, policy state and target.

Both backends keep one :class:`DeploymentAutoscaler` per autoscaling deployment and feed it the
same readings: each replica's ``/-/metrics`` (read every ``metrics_interval_s``) and each caller's
queued requests (reported by :mod:`kubeserve.runtime.load_report`). :meth:`step` turns them into
the replica count to run (:func:`kubeserve.control.autoscaling.decide`) and remembers why it
changed, for the status. No I/O and no clock: every method takes ``now`` (Unix time).

A replica reports the integral of its ongoing requests (request-seconds) and its uptime; two reads
give the exact mean load between them, so short bursts between reads count (a gauge read every
10 s would mostly miss them). That mean is a sample at the earlier read, holding until the later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeserve.control import autoscaling
from kubeserve.control.autoscaling import AutoscalingConfig, Direction, PolicyState, Sample
from kubeserve.schema.config import is_default_policy

__all__ = [
    "CallerReports",
    "DeploymentAutoscaler",
    "PolicyAnswer",
    "PolicyFailure",
    "PolicyMember",
    "PolicyOutcome",
    "ReplicaLoad",
    "ScalingRecord",
    "ask_policy",
    "policy_decisions",
]

#: Decisions kept for the status.
MAX_DECISIONS = 10
_REPLICA = "replica:"
_CALLER = "caller:"


@dataclass(frozen=True)
class ReplicaLoad:
    """One read of a replica's ``/-/metrics``."""

    ongoing: float
    #: ``kubeserve_replica_ongoing_request_seconds_total``
    ongoing_area: float
    #: ``kubeserve_replica_uptime_seconds``
    uptime_s: float

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> ReplicaLoad | None:
        """From a replica's metrics by name; ``None`` when one is missing."""
        try:
            return cls(
                ongoing=metrics["kubeserve_replica_ongoing_requests"],
                ongoing_area=metrics["kubeserve_replica_ongoing_request_seconds_total"],
                uptime_s=metrics["kubeserve_replica_uptime_seconds"],
            )
        except KeyError:
            return None


@dataclass(frozen=True)
class ScalingRecord:
    """A change of the target, in Ray's ``ScalingDecision`` terms."""

    timestamp_s: float
    reason: str
    prev_num_replicas: int
    curr_num_replicas: int
    policy: str


@dataclass(frozen=True)
class _Read:
    at: float
    load: ReplicaLoad


class CallerReports:
    """What each caller (a proxy, a handle client) last reported waiting, by deployment key.

    A caller reports only the keys where requests wait; a key it reported before and leaves out
    now has nothing waiting any more. :meth:`update` turns a report into a count for every key
    concerned, zeros included. A caller is forgotten once nothing waits at it.
    """

    def __init__(self) -> None:
        self._keys: dict[str, set[str]] = {}

    def update(self, caller_id: str, queued: Mapping[str, int]) -> dict[str, int]:
        previous = self._keys.get(caller_id, set())
        counts = {key: int(queued.get(key, 0)) for key in previous | set(queued)}
        waiting = {key for key, n in queued.items() if n}
        if waiting:
            self._keys[caller_id] = waiting
        else:
            self._keys.pop(caller_id, None)
        return counts


class DeploymentAutoscaler:
    """Owns one deployment's autoscaling target; the backend makes the replica count follow it."""

    def __init__(
        self,
        raw_config: Mapping[str, Any],
        now: float,
        target_capacity: float | None = None,
        capacity_direction: Direction | None = None,
    ) -> None:
        self.raw_config = dict(raw_config)
        self.config = AutoscalingConfig.from_mapping(raw_config)
        self.target_capacity = target_capacity
        self.capacity_direction = capacity_direction
        self.target = autoscaling.initial_target(self.config, target_capacity, capacity_direction)
        self.state = PolicyState()
        #: why the custom policy's last answer was not used ("" when it was, or none is set)
        self.policy_error = ""
        self.last_scale_up_time: float | None = None
        self.last_scale_down_time: float | None = None
        self.decisions: deque[ScalingRecord] = deque(maxlen=MAX_DECISIONS)
        #: the load of the last decision (running plus queued requests, aggregated)
        self.last_load = 0.0
        #: when the backend should read the replicas' metrics next
        self.next_read_at = now
        self._series: dict[str, list[Sample]] = {}
        self._reads: dict[str, _Read] = {}
        self._caller_keys: set[str] = set()

    # -- configuration ---------------------------------------------------------------------------
    def reconfigure(
        self,
        raw_config: Mapping[str, Any],
        now: float,
        target_capacity: float | None,
        capacity_direction: Direction | None,
    ) -> None:
        """A new config or capacity: as in Ray, a changed config with ``initial_replicas`` starts
        over from it; otherwise the current target stays, within the new bounds."""
        changed = dict(raw_config) != self.raw_config
        if (
            not changed
            and target_capacity == self.target_capacity
            and capacity_direction == self.capacity_direction
        ):
            return
        self.raw_config = dict(raw_config)
        self.config = AutoscalingConfig.from_mapping(raw_config)
        self.target_capacity, self.capacity_direction = target_capacity, capacity_direction
        self.state = PolicyState()
        if changed and self.config.initial_replicas is not None:
            wanted = self.config.initial_replicas
        else:
            wanted = self.target
        low, high = autoscaling.bounds(self.config, target_capacity, capacity_direction)
        self._move(
            max(low, min(high, wanted)), now, "Autoscaling config or target_capacity changed."
        )

    def adopt(self, count: int) -> None:
        """Start from ``count`` replicas already running (within the bounds), as after a
        restart of whoever owns this autoscaler."""
        low, high = autoscaling.bounds(self.config, self.target_capacity, self.capacity_direction)
        self.target = max(low, min(high, count))

    # -- readings --------------------------------------------------------------------------------
    def record_replica(self, replica_id: str, load: ReplicaLoad, now: float) -> None:
        source = _REPLICA + replica_id
        previous = self._reads.get(source)
        self._reads[source] = _Read(now, load)
        series = self._series.setdefault(source, [])
        elapsed = None if previous is None else load.uptime_s - previous.load.uptime_s
        if previous is None or elapsed is None or elapsed <= 0:
            series.append(Sample(now, load.ongoing))
            return
        mean = max(0.0, (load.ongoing_area - previous.load.ongoing_area) / elapsed)
        if series and series[-1].timestamp == previous.at:
            series[-1] = Sample(previous.at, mean)  # the mean replaces the instant reading there
        else:
            series.append(Sample(previous.at, mean))
        series.append(Sample(now, load.ongoing))

    def record_queued(self, caller_id: str, queued: int, now: float) -> None:
        source = _CALLER + caller_id
        self._caller_keys.add(source)
        self._series.setdefault(source, []).append(Sample(now, float(queued)))

    def queued_now(self) -> int:
        """Requests waiting at callers by their latest reports."""
        return int(sum(self._series[s][-1].value for s in self._caller_keys if self._series.get(s)))

    def forget_replicas(self, live: Iterable[str]) -> None:
        """Drop the history of replicas that are gone (their requests are no one's now)."""
        keep = {_REPLICA + replica_id for replica_id in live}
        for source in [s for s in self._series if s.startswith(_REPLICA) and s not in keep]:
            del self._series[source]
            self._reads.pop(source, None)

    # -- decisions -------------------------------------------------------------------------------
    @property
    def policy(self) -> dict[str, Any] | None:
        """The deployment's custom ``policy`` (``policy_function``, ``policy_kwargs``), or
        ``None`` for Ray's default policy, which :meth:`step` runs here."""
        policy = self.raw_config.get("policy")
        return None if is_default_policy(policy) else dict(policy or {})

    def step(self, running: int, now: float) -> bool:
        """Decide with the readings so far (Ray's default policy); whether the target changed."""
        return self._decide(running, self._measure(running, now), now, None)

    def policy_context(
        self, running: int, now: float, replica_ids: Iterable[str] = ()
    ) -> dict[str, Any] | None:
        """What a custom policy is asked with (Ray's ``AutoscalingContext`` as JSON; the policy
        process adds the policy's own state), or ``None`` after a cold start decided at once
        without asking it, as Ray's wrapper of custom policies does."""
        load = self._measure(running, now)
        if autoscaling.is_cold_start(running, load):
            self._decide(running, load, now, None)
            return None
        low, high = autoscaling.bounds(self.config, self.target_capacity, self.capacity_direction)
        return {
            "current_num_replicas": running,
            "target_num_replicas": self.target,
            "running_replicas": list(replica_ids),
            "total_num_requests": load,
            "total_queued_requests": float(self.queued_now()),
            "capacity_adjusted_min_replicas": low,
            "capacity_adjusted_max_replicas": high,
            "last_scale_up_time": self.last_scale_up_time,
            "last_scale_down_time": self.last_scale_down_time,
            "current_time": now,
            "config": {k: v for k, v in self.raw_config.items() if k != "policy"},
        }

    def apply_policy(self, running: int, now: float, answer: object) -> bool:
        """A custom policy's answer for the context :meth:`policy_context` gave: scaled, delayed
        and bounded as Ray does; an answer that is no count leaves the target as it is and sets
        :attr:`policy_error`. Whether the target changed."""
        try:
            desired = autoscaling.check_policy_answer(answer)
        except ValueError as exc:
            self.policy_failed(str(exc))
            return False
        self.policy_error = ""
        return self._decide(running, self.last_load, now, desired)

    def policy_failed(self, message: str) -> None:
        """The custom policy raised, hung or answered garbage: the target stays."""
        self.policy_error = f"autoscaling policy failed, replica count unchanged: {message}"

    def _measure(self, running: int, now: float) -> float:
        self._trim(now)
        load = autoscaling.total_requests(
            list(self._series.values()),
            now,
            self.config.look_back_period_s,
            self.config.aggregation_function,
        )
        if running == 0:
            # Nothing serves: whatever waits now must start a replica, however the window's
            # average (which a report of 0 an instant ago still holds down) comes out.
            load = max(load, float(self.queued_now()))
        self.last_load = load
        return load

    def _decide(self, running: int, load: float, now: float, desired: float | None) -> bool:
        decision = autoscaling.decide(
            self.config,
            running=running,
            target=self.target,
            load=load,
            state=self.state,
            now=now,
            target_capacity=self.target_capacity,
            capacity_direction=self.capacity_direction,
            desired=desired,
        )
        self.state = decision.state
        return self._move(decision.target, now, decision.reason)

    def _move(self, target: int, now: float, reason: str) -> bool:
        if target == self.target:
            return False
        policy = self.policy
        name = "default_autoscaling_policy" if policy is None else policy["policy_function"]
        self.decisions.append(ScalingRecord(now, reason, self.target, target, str(name)))
        if target > self.target:
            self.last_scale_up_time = now
        else:
            self.last_scale_down_time = now
        self.target = target
        return True

    def _trim(self, now: float) -> None:
        start = now - self.config.look_back_period_s - self.config.metrics_interval_s
        for source, series in list(self._series.items()):
            kept = [s for s in series if s.timestamp >= start]
            if kept:
                self._series[source] = kept
            else:
                del self._series[source]
                self._caller_keys.discard(source)

    # -- status ----------------------------------------------------------------------------------
    def detail(self, running: int) -> dict[str, Any]:
        """Ray 2.60's ``DeploymentAutoscalingDetail`` (as a dict)."""
        if self.target > running:
            scaling_status = "UPSCALING"
        elif self.target < running:
            scaling_status = "DOWNSCALING"
        else:
            scaling_status = "STABLE"
        return {
            "scaling_status": scaling_status,
            "decisions": [record.__dict__ for record in self.decisions],
            "metrics": {
                "total_num_requests": self.last_load,
                "queued_requests": self.queued_now(),
                "target_ongoing_requests": self.config.target_ongoing_requests,
            },
        }


# -- custom policies -----------------------------------------------------------------------------
#
# A custom policy is user code and runs where the application's code does (a process of its
# environment on one machine, a pod of its image on Kubernetes), never here. Both backends ask it
# the same way: :func:`ask_policy` builds the request from the autoscalers, hands it to the
# backend's ``ask`` (which carries it to :mod:`kubeserve.runtime.autoscaling_policy` and back),
# and applies the answer, Ray's wrapper included (scaling factors, delays, bounds).


class PolicyFailure(Exception):
    """The policy could not decide: the message says why, for the deployment's status."""


#: Carries one request (``{"scope", "policy", "contexts"}``) to the application's policy host
#: and returns its raw answer (``{"decisions": ...}`` or ``{"error": ...}``); raises
#: :class:`PolicyFailure` when the host cannot be reached or does not answer in time.
PolicyAnswer = Callable[[dict[str, Any]], Awaitable[object]]


def policy_decisions(answer: object) -> dict[str, object]:
    """The policy host's raw counts by deployment; :class:`PolicyFailure` for its error or for
    anything else than a decision."""
    if isinstance(answer, dict) and "error" in answer:
        raise PolicyFailure(str(answer["error"]))
    decisions = answer.get("decisions") if isinstance(answer, dict) else None
    if not isinstance(decisions, dict):
        raise PolicyFailure(f"the policy host answered {str(answer)[:200]!r}")
    return {str(name): count for name, count in decisions.items()}


@dataclass(frozen=True)
class PolicyMember:
    """One autoscaling deployment a policy decides for, as it runs now."""

    autoscaler: DeploymentAutoscaler
    running: int
    replica_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PolicyOutcome:
    """What :func:`ask_policy` did: the deployments whose target changed, and the failure it
    recorded on them ("" when the policy answered)."""

    changed: list[str]
    error: str = ""


async def ask_policy(
    answer: PolicyAnswer,
    scope: Literal["deployment", "application"],
    policy: Mapping[str, Any],
    members: Mapping[str, PolicyMember],
    clock: Callable[[], float],
) -> PolicyOutcome:
    """One decision of a custom policy for ``members`` (one deployment, or every autoscaling
    deployment of an application for its ``autoscaling_policy``).

    As Ray's wrapper: a deployment on a cold start is decided at once without asking; a count is
    scaled, delayed and bounded by :meth:`DeploymentAutoscaler.apply_policy`; an application
    policy that leaves a deployment out keeps its count. A failure (``answer`` raised, or the
    policy's own error) leaves every count as it was and is recorded on each deployment asked.
    """
    before = {name: m.autoscaler.target for name, m in members.items()}
    now = clock()
    contexts: dict[str, dict[str, Any]] = {}
    for name, member in members.items():
        context = member.autoscaler.policy_context(member.running, now, member.replica_ids)
        if context is not None:
            contexts[name] = context
    error = ""
    if contexts:
        request = {"scope": scope, "policy": dict(policy), "contexts": contexts}
        try:
            decisions = policy_decisions(await answer(request))
        except PolicyFailure as exc:
            error = str(exc) if scope == "deployment" else f"application policy: {exc}"
            for name in contexts:
                members[name].autoscaler.policy_failed(error)
        else:
            now = clock()
            for name in contexts:
                if scope == "deployment" or name in decisions:
                    member = members[name]
                    member.autoscaler.apply_policy(member.running, now, decisions.get(name))
    changed = [name for name, m in members.items() if m.autoscaler.target != before[name]]
    return PolicyOutcome(changed, error)
