"""Autoscaling on Kubernetes: the operator sets each replica Deployment's ``replicas`` itself.

No HorizontalPodAutoscaler and no metrics server: the operator reads every ready replica pod's
``/-/metrics`` over the data plane's ``CONTROL`` channel (as it pushes ``user_config``) every
``metrics_interval_s``, feeds :class:`~kubeserve.control.autoscaling_state.DeploymentAutoscaler`
(the same decisions as the local backend), and renders the Deployment with its target.

Requests waiting at callers count too, as on the local backend: proxy and replica pods report them
to the operator's admin server (``GET /-/load``, signed with their instance's data-plane secret;
:mod:`kubeserve.runtime.load_report`), and :meth:`Autoscalers.record_queued` decides at once when
a deployment without replicas has a request waiting, which is what scales it up from zero. Without
a URL for those reports (``kubeserve operator --report-url``) scaling to zero is refused.

A custom policy (``autoscaling_config.policy``, or the application's ``autoscaling_policy``,
which decides for all its autoscaling deployments in one call) is user code: the operator asks
it in the application's policy host pod (:mod:`.policy_host`) with the same request the local
controller sends its policy process, and applies the answer as the local backend does
(:func:`~kubeserve.control.autoscaling_state.ask_policy`: Ray's cold start, scaling factors,
delays and bounds). A failure leaves the counts as they are and is said in the deployments'
status.

Owns one autoscaler per autoscaling deployment (keyed ``namespace/application/deployment``), in
the operator's memory: after an operator restart a deployment starts again from its current
replica count's bounds, as Ray's controller does after losing its state. Reads run in the
background; ``on_decided`` (the operator's wake-up) runs with the keys of the autoscalers whose
target changed or whose next read is due, so the pass over their applications renders or reads
again (only theirs: with a thousand applications, a wake-up of all of them at every read of one
made every read a thousand passes).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeserve.backends.kubernetes.pods import serving_pods
from kubeserve.backends.kubernetes.policy_host import PolicyHost
from kubeserve.control.autoscaling import CapacityTracker, Direction
from kubeserve.control.autoscaling_state import (
    DeploymentAutoscaler,
    PolicyMember,
    ReplicaLoad,
    ask_policy,
)
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kubernetes import contract

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = 5.0


#: Why ``min_replicas: 0`` is refused by an operator started without ``--report-url``: a request
#: for a deployment without replicas would wait at a pod with no way to tell the operator.
SCALE_TO_ZERO_REFUSED = (
    "scaling to zero (min_replicas or initial_replicas 0) needs the operator's --report-url "
    "(the Helm chart sets it), where pods report the requests that wait for a replica; "
    "use min_replicas >= 1 or set it"
)


def scaling_key(namespace: str, application: str, deployment: str) -> str:
    """The key of a deployment's autoscaler: ``application`` is its ServeApplication's name."""
    return f"{namespace}/{application}/{deployment}"


def scale_to_zero_paths(
    scalings: Iterable[Mapping[str, Any] | None],
) -> list[tuple[str | int, ...]]:
    """Where the ``autoscaling_config`` of deployments (overrides or effective configs, in order)
    asks to scale to zero: ``(index, "autoscaling_config", field)`` for each ``min_replicas`` /
    ``initial_replicas`` 0."""
    paths: list[tuple[str | int, ...]] = []
    for i, scaling in enumerate(scalings):
        scaling = scaling or {}
        for field_name in ("min_replicas", "initial_replicas"):
            if scaling.get(field_name) == 0:
                paths.append((i, "autoscaling_config", field_name))
    return paths


@dataclass
class Autoscalers:
    #: schedules a reconcile pass soon over the applications of these autoscaler keys (the
    #: operator's wake-up)
    on_decided: Callable[[Iterable[str]], None]
    _scalers: dict[str, DeploymentAutoscaler] = field(default_factory=dict)
    #: the background read of each group of keys decided together
    _tasks: dict[tuple[str, ...], asyncio.Task[None]] = field(default_factory=dict)
    #: per ServeInstance uid: its ``target_capacity`` and where it heads
    _capacities: dict[str, CapacityTracker] = field(default_factory=dict)

    def capacity(
        self, instance_uid: str, apps: Iterable[str], target_capacity: float | None
    ) -> tuple[float | None, Direction | None]:
        """The instance's ``target_capacity`` and its direction (see :class:`CapacityTracker`)."""
        tracker = self._capacities.setdefault(instance_uid, CapacityTracker())
        return tracker.update(apps, target_capacity)

    def target(
        self,
        key: str,
        effective: EffectiveDeployment,
        capacity: tuple[float | None, Direction | None] = (None, None),
        running_count: int | None = None,
    ) -> int | None:
        """The replica count to render for ``key``, or ``None`` when it does not autoscale.

        ``running_count`` is the replica count of the existing Deployment, if any: an operator
        that starts (again) adopts it, within the bounds, instead of jumping back to
        ``initial_replicas``.
        """
        raw = effective.autoscaling_config
        if not raw:
            self.forget(key)
            return None
        scaler = self._scalers.get(key)
        if scaler is None:
            scaler = self._scalers[key] = DeploymentAutoscaler(raw, time.time(), *capacity)
            if running_count is not None:
                scaler.adopt(running_count)
        else:
            scaler.reconfigure(raw, time.time(), *capacity)
        return scaler.target

    def last_decision(self, key: str) -> dict[str, Any] | None:
        """The last change of ``key``'s target (Ray's ``ScalingDecision`` fields), if any."""
        scaler = self._scalers.get(key)
        if scaler is None or not scaler.decisions:
            return None
        record = scaler.decisions[-1]
        return {
            "timestamp_s": record.timestamp_s,
            "reason": record.reason,
            "prev_num_replicas": record.prev_num_replicas,
            "curr_num_replicas": record.curr_num_replicas,
        }

    def policy_error(self, key: str) -> str:
        """Why ``key``'s custom policy last failed to decide ("" when it did, or has none)."""
        scaler = self._scalers.get(key)
        return "" if scaler is None else scaler.policy_error

    def observe(
        self,
        pods: Mapping[str, list[dict[str, Any]]],
        secret: bytes,
        app_policy: Mapping[str, Any] | None = None,
        policy_host: PolicyHost | None = None,
    ) -> None:
        """Read the load of the pods of an application's deployments (``pods`` by autoscaler
        key) in the background when their interval has come, and decide.

        ``app_policy``: the application's ``autoscaling_policy``, which decides for all its
        autoscaling deployments at once (Ray 2.60: over their own policies); else each deployment
        decides alone, by Ray's default policy or its own. ``policy_host`` answers the custom
        policies (see :mod:`.policy_host`).
        """
        scaled = {key: self._scalers[key] for key in pods if key in self._scalers}
        groups = [scaled] if app_policy is not None else [{k: v} for k, v in scaled.items()]
        for group in groups:
            if not group:
                continue
            task_key = tuple(sorted(group))
            now = time.time()
            if task_key in self._tasks or now < min(s.next_read_at for s in group.values()):
                continue
            for scaler in group.values():
                scaler.next_read_at = now + scaler.config.metrics_interval_s
            members = {key: _Observed(scaler, pods[key]) for key, scaler in group.items()}
            task = asyncio.ensure_future(
                self._read_and_decide(members, secret, app_policy, policy_host)
            )
            self._tasks[task_key] = task
            task.add_done_callback(functools.partial(self._done, task_key))

    def _done(self, task_key: tuple[str, ...], _task: asyncio.Task[None]) -> None:
        self._tasks.pop(task_key, None)

    def record_queued(self, key: str, caller_id: str, queued: int) -> None:
        """A caller's report of requests waiting for ``key``; a request waiting on a deployment
        scaled to zero decides now (and wakes the operator), as on the local backend."""
        scaler = self._scalers.get(key)
        if scaler is None:
            return
        now = time.time()
        scaler.record_queued(caller_id, queued, now)
        if queued and scaler.target == 0 and scaler.step(0, now):
            log.info("%s: %s", key, scaler.decisions[-1].reason)
            self.on_decided([key])

    def forget(self, key: str) -> None:
        self._scalers.pop(key, None)
        for task_key in [k for k in self._tasks if key in k]:
            self._tasks.pop(task_key).cancel()

    async def _read_and_decide(
        self,
        members: Mapping[str, _Observed],
        secret: bytes,
        app_policy: Mapping[str, Any] | None,
        policy_host: PolicyHost | None,
    ) -> None:
        ready = {key: _ready(member.pods) for key, member in members.items()}
        reads = [(key, pod) for key, pods in ready.items() for pod in pods]
        loads = await asyncio.gather(*(_read_load(pod.ip, pod.name, secret) for _, pod in reads))
        now = time.time()
        for (key, pod), load in zip(reads, loads, strict=True):
            if load is not None:
                members[key].scaler.record_replica(pod.uid, load, now)
        for key, member in members.items():
            member.scaler.forget_replicas(pod.uid for pod in ready[key])
        changed = await self._decide(members, ready, app_policy, policy_host, now)
        for key in changed:
            log.info("%s: %s", key, members[key].scaler.decisions[-1].reason)
        if changed:
            self.on_decided(changed)
        due = min(member.scaler.next_read_at for member in members.values())
        wake = functools.partial(self.on_decided, list(members))
        asyncio.get_running_loop().call_later(max(0.0, due - time.time()), wake)

    @staticmethod
    async def _decide(
        members: Mapping[str, _Observed],
        ready: Mapping[str, list[_ReadyPod]],
        app_policy: Mapping[str, Any] | None,
        policy_host: PolicyHost | None,
        now: float,
    ) -> list[str]:
        """Decide for ``members`` (the keys whose target changed): Ray's default policy here, a
        custom one in the application's policy host."""
        scope: Literal["deployment", "application"] = "application"
        policy = app_policy
        if policy is None:
            ((key, member),) = members.items()
            policy, scope = member.scaler.policy, "deployment"
            if policy is None:
                return [key] if member.scaler.step(len(ready[key]), now) else []
        asked = {
            _deployment(key): PolicyMember(m.scaler, len(ready[key]), [p.name for p in ready[key]])
            for key, m in members.items()
        }
        host = policy_host or PolicyHost("", b"")
        outcome = await ask_policy(host.answer, scope, policy, asked, time.time)
        if outcome.error:
            log.warning("%s: autoscaling policy failed: %s", ", ".join(members), outcome.error)
        keys = {_deployment(key): key for key in members}
        return [keys[name] for name in outcome.changed]


def _deployment(key: str) -> str:
    """The deployment's name in its :func:`scaling_key`."""
    return key.split("/", 2)[2]


@dataclass(frozen=True)
class _Observed:
    scaler: DeploymentAutoscaler
    pods: list[dict[str, Any]]


@dataclass(frozen=True)
class _ReadyPod:
    uid: str
    ip: str
    name: str


def _ready(pods: list[dict[str, Any]]) -> list[_ReadyPod]:
    return [
        _ReadyPod(str(pod["metadata"]["uid"]), str(pod["status"]["podIP"]), pod["metadata"]["name"])
        for pod in serving_pods(pods)
    ]


def external_replicas(obj: dict[str, Any]) -> dict[str, int]:
    """The counts the external scaling API set on a ``ServeApplication`` (its
    ``EXTERNAL_REPLICAS_ANNOTATION``, see :mod:`kubeserve.runtime.kubernetes.contract`);
    unreadable values are ignored."""
    raw = (obj["metadata"].get("annotations") or {}).get(contract.EXTERNAL_REPLICAS_ANNOTATION)
    try:
        counts = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(counts, dict):
        return {}
    return {str(k): v for k, v in counts.items() if isinstance(v, int) and v >= 0}


async def _read_load(ip: str, pod_name: str, secret: bytes) -> ReplicaLoad | None:
    """The load of the replica in pod ``pod_name`` (its replica id, which the handshake names)."""
    try:
        status, body = await channel.request(
            ip,
            contract.REPLICA_PORT,
            "GET",
            wire.METRICS_PATH,
            secret,
            pod_name,
            timeout_s=_READ_TIMEOUT_S,
        )
    except (OSError, TimeoutError) as exc:
        log.debug("reading the load of the replica at %s failed: %s", ip, exc)
        return None
    if status != 200:
        return None
    return ReplicaLoad.from_metrics(wire.parse_metrics(body.decode("utf-8", "replace")))
