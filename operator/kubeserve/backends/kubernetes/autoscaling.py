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

Owns one autoscaler per autoscaling deployment (keyed ``namespace/application/deployment``), in
the operator's memory: after an operator restart a deployment starts again from its current
replica count's bounds, as Ray's controller does after losing its state. Reads run in the
background; ``on_decided`` (the operator's wake-up) runs when a target changed or the next read is
due, so the next reconcile pass renders or reads again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeserve.backends.kubernetes.pods import pod_ready
from kubeserve.control.autoscaling import CapacityTracker, Direction
from kubeserve.control.autoscaling_state import DeploymentAutoscaler, ReplicaLoad
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.config import is_default_policy

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


CUSTOM_POLICY_REFUSED = (
    "custom autoscaling policies run with kubeserve start only for now: the operator has no "
    "process in the application's image to call them in; leave policy_function unset (Ray's "
    "default policy) on Kubernetes"
)


def custom_policy_paths(app_config: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """Where an application config asks for a custom autoscaling policy."""
    paths: list[tuple[str | int, ...]] = []
    if not is_default_policy(app_config.get("autoscaling_policy")):
        paths.append(("autoscaling_policy", "policy_function"))
    for i, override in enumerate(app_config.get("deployments") or []):
        policy = (override.get("autoscaling_config") or {}).get("policy")
        if not is_default_policy(policy):
            paths.append(("deployments", i, "autoscaling_config", "policy", "policy_function"))
    return paths


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
    #: schedules a reconcile pass soon (the operator's wake-up)
    on_decided: Callable[[], None]
    _scalers: dict[str, DeploymentAutoscaler] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
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

    def observe(self, key: str, pods: list[dict[str, Any]], secret: bytes) -> None:
        """Read the load of ``pods`` in the background when the interval has come."""
        scaler = self._scalers.get(key)
        if scaler is None or key in self._tasks or time.time() < scaler.next_read_at:
            return
        scaler.next_read_at = time.time() + scaler.config.metrics_interval_s
        task = asyncio.ensure_future(self._read_and_decide(scaler, pods, secret))
        self._tasks[key] = task
        task.add_done_callback(lambda _task: self._tasks.pop(key, None))

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
            self.on_decided()

    def forget(self, key: str) -> None:
        self._scalers.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def _read_and_decide(
        self, scaler: DeploymentAutoscaler, pods: list[dict[str, Any]], secret: bytes
    ) -> None:
        ready = [
            (str(pod["metadata"]["uid"]), str(pod["status"]["podIP"]), str(pod["metadata"]["name"]))
            for pod in pods
            if pod_ready(pod)
            and (pod.get("status") or {}).get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
        ]
        loads = await asyncio.gather(*(_read_load(ip, name, secret) for _, ip, name in ready))
        now = time.time()
        for (uid, _, _), load in zip(ready, loads, strict=True):
            if load is not None:
                scaler.record_replica(uid, load, now)
        scaler.forget_replicas(uid for uid, _, _ in ready)
        if scaler.policy is not None:  # set in code: the config's are refused (see refusals)
            if not scaler.policy_error:
                scaler.policy_failed(CUSTOM_POLICY_REFUSED)
                log.warning("%s", scaler.policy_error)
        elif scaler.step(len(ready), now):
            log.info("%s", scaler.decisions[-1].reason)
            self.on_decided()
        loop = asyncio.get_running_loop()
        loop.call_later(max(0.0, scaler.next_read_at - time.time()), self.on_decided)


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
