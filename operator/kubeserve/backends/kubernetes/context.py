"""What every reconciler of the operator shares: the API client, the caches, and write-dedup.

The operator writes only what changed: :meth:`OperatorContext.apply` remembers the digest of each
object it applied and skips an identical re-apply while the object still exists in the cache, and
:meth:`OperatorContext.patch_status` skips a status equal to the cached one. When nothing changes,
a reconcile pass makes no API request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.control import config as config_rules
from kubeserve.runtime import wire
from kubeserve.runtime.kube import Kube, KubeError

log = logging.getLogger(__name__)

#: application states announced as Warning Events, with the Event's reason
_FAILED_STATES = {"DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}

#: the port every replica container listens on (see the backend's contract)
REPLICA_PORT = 8000


@dataclass
class OperatorContext:
    kube: Kube
    cache: ClusterCache
    session: aiohttp.ClientSession
    #: digest of the last object applied, by kind/namespace/name
    applied: dict[str, str] = field(default_factory=dict)
    #: replica process (:func:`replica_key`) -> the user_config version it has applied
    user_configs: dict[str, str] = field(default_factory=dict)
    #: namespace/application/deployment/version keys that reached HEALTHY once (in this process)
    healthy_versions: set[str] = field(default_factory=set)
    _pushing: set[str] = field(default_factory=set)

    async def apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        digest = config_rules.fingerprint(obj)
        exists = self.cache.get(obj["kind"], meta.get("namespace", ""), meta["name"]) is not None
        if exists and self.applied.get(key) == digest:
            return
        await self.kube.apply(obj)
        self.applied[key] = digest

    async def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Write ``status`` when it differs; a move into a failed state is also an Event."""
        meta = obj["metadata"]
        current = self.cache.get(obj["kind"], meta["namespace"], meta["name"]) or obj
        old = {k: v for k, v in (current.get("status") or {}).items() if k != "kopf"}
        if all(old.get(k) == v for k, v in status.items()):
            return
        failure = status.get("appStatus")
        if failure in _FAILED_STATES and old.get("appStatus") != failure:
            await self.event(obj, _FAILED_STATES[failure], str(status.get("message") or failure))
        status = _with_removals(old, status)
        await self.kube.merge_patch(
            obj["kind"], meta["namespace"], meta["name"], {"status": status}, "status"
        )

    async def event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        """A Warning Event on ``obj`` (``kubectl describe`` and dashboards show it)."""
        meta = obj["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "kubeserve-operator"},
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
        }
        try:
            await self.kube.create("Event", meta["namespace"], body)
        except KubeError as exc:  # an Event is best effort; the status already says it
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc)

    async def push_user_config(self, pods: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """Send the deployment's user_config to every ready replica that has not applied it."""
        version = config_rules.user_config_version(config)
        for pod in pods:
            uid = replica_key(pod)
            ip = (pod.get("status") or {}).get("podIP")
            if (
                not ip
                or not _ready(pod)
                or self.user_configs.get(uid) == version
                or uid in self._pushing
            ):
                continue
            self._pushing.add(uid)
            task = asyncio.ensure_future(self._push(uid, ip, config.get("user_config"), version))
            task.add_done_callback(functools.partial(self._pushed, uid))

    def _pushed(self, uid: str, _task: object) -> None:
        self._pushing.discard(uid)

    async def _push(self, uid: str, ip: str, user_config: Any, version: str) -> None:
        url = f"http://{ip}:{REPLICA_PORT}{wire.RECONFIGURE_PATH}"
        try:
            async with self.session.post(
                url, json={"user_config": user_config}, timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                if response.status == 200:
                    self.user_configs[uid] = version
                else:
                    log.warning("reconfigure of pod %s failed: %s", uid, await response.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("reconfigure of pod %s at %s failed: %s", uid, ip, exc)
        finally:
            self.wake()

    def wake(self) -> None:
        """Overridden by the operator: schedule a reconcile pass soon."""


def _ready(pod: dict[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def pod_ready(pod: dict[str, Any]) -> bool:
    return _ready(pod)


def replica_key(pod: dict[str, Any]) -> str:
    """One replica process: the pod and its container restart count.

    A restarted container is a new process that has applied only what it read at start-up, so
    it must be counted (and pushed to) afresh.
    """
    restarts = sum(
        int(c.get("restartCount", 0))
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    )
    return f"{pod['metadata']['uid']}/{restarts}"


def _with_removals(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` as a merge patch over ``old``: map entries that are gone become ``None``.

    Status maps (deployments, proxies, applications) are keyed by name; without the explicit
    nulls a merge patch would keep entries for things that no longer exist forever.
    """
    patch = dict(new)
    for key, value in new.items():
        previous = old.get(key)
        if isinstance(value, dict) and isinstance(previous, dict):
            patch[key] = {**dict.fromkeys(set(previous) - set(value)), **value}
    return patch


def _now() -> str:
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
