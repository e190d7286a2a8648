"""What every reconciler of the operator shares: the API client, the caches, and write-dedup.

The operator writes only what changed: :meth:`OperatorContext.apply` remembers the digest of each
object it applied and skips an identical re-apply while the object still exists in the cache, and
:meth:`OperatorContext.patch_status` skips a status equal to the cached one. When nothing changes,
a reconcile pass makes no API request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeserve.backends.kubernetes import names, render
from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.control import config as config_rules
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kube import Kube, KubeConflict, KubeError

log = logging.getLogger(__name__)

#: application states announced as Warning Events, with the Event's reason
_FAILED_STATES = {"DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}
_RECONFIGURE_TIMEOUT_S = 30.0


@dataclass
class OperatorContext:
    kube: Kube
    cache: ClusterCache
    #: the operator's own namespace (its pods may reach replicas: see the NetworkPolicies)
    operator_namespace: str
    #: digest of the last object applied, by kind/namespace/name
    applied: dict[str, str] = field(default_factory=dict)
    #: replica process (:func:`replica_key`) -> the user_config version it has applied
    user_configs: dict[str, str] = field(default_factory=dict)
    #: namespace/application/deployment/version keys that reached HEALTHY once (in this process)
    healthy_versions: set[str] = field(default_factory=set)
    _pushing: set[str] = field(default_factory=set)
    #: ServeInstance uid -> its data-plane secret (never logged, never in a status)
    _secrets: dict[str, bytes] = field(default_factory=dict, repr=False)
    #: object uid -> the failed state last announced by an Event (a pass may still read the
    #: status it wrote before from a cache that lags; it must not announce the failure twice)
    _announced: dict[str, str] = field(default_factory=dict)

    async def data_plane_secret(self, instance: dict[str, Any]) -> bytes:
        """The data-plane secret of ``instance`` (a ServeInstance object), read once and cached.

        Creates the Secret :func:`~.names.dataplane_secret_name` with 32 random bytes (hex) when
        it is missing, owned by the instance. One left by a deleted instance of the same name
        (another uid) raises :class:`KubeError` (the pass is retried) until the garbage collector
        removed it, so the operator needs only ``get`` and ``create`` on Secrets. Keyed by the
        instance's uid: a recreated instance gets a fresh secret.
        """
        meta = instance["metadata"]
        cached = self._secrets.get(meta["uid"])
        if cached is not None:
            return cached
        namespace, name = meta["namespace"], names.dataplane_secret_name(meta["name"])
        obj = await self.kube.get("Secret", namespace, name)
        if obj is not None and not _owned_by(obj, meta["uid"]):
            raise KubeError(  # retried: the garbage collector removes it shortly
                409, "Conflict", f"Secret {namespace}/{name} of a deleted instance is still there"
            )
        if obj is None:
            wanted = render.render_data_plane_secret(
                render.instance_view(instance), channel.new_secret()
            )
            try:
                obj = await self.kube.create("Secret", namespace, wanted)
            except KubeConflict:  # created meanwhile: read it
                obj = await self.kube.get("Secret", namespace, name)
        secret = _secret_value(obj)
        if secret is None:
            raise KubeError(500, "InvalidSecret", f"Secret {namespace}/{name} holds no valid key")
        self._secrets[meta["uid"]] = secret
        return secret

    def forget_data_plane_secret(self, instance_uid: str) -> None:
        """Read the Secret again next time (a replica refused the cached one)."""
        self._secrets.pop(instance_uid, None)

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
        if failure not in _FAILED_STATES:
            self._announced.pop(meta["uid"], None)
        elif old.get("appStatus") != failure and self._announced.get(meta["uid"]) != failure:
            self._announced[meta["uid"]] = failure
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

    async def push_user_config(
        self,
        pods: list[dict[str, Any]],
        config: dict[str, Any],
        secret: bytes,
        instance_uid: str,
    ) -> None:
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
            body = json.dumps({"user_config": config.get("user_config")}).encode()
            push = self._push(uid, ip, body, version, secret, instance_uid)
            task = asyncio.ensure_future(push)
            task.add_done_callback(functools.partial(self._pushed, uid))

    def _pushed(self, uid: str, _task: object) -> None:
        self._pushing.discard(uid)

    async def _push(
        self, uid: str, ip: str, body: bytes, version: str, secret: bytes, instance_uid: str
    ) -> None:
        """``POST /-/reconfigure`` on a CONTROL channel (the replica's handshake)."""
        try:
            status, answer = await channel.request(
                ip,
                render.REPLICA_PORT,
                "POST",
                wire.RECONFIGURE_PATH,
                secret,
                body,
                timeout_s=_RECONFIGURE_TIMEOUT_S,
            )
            if status == 200:
                self.user_configs[uid] = version
            else:
                text = answer.decode(errors="replace")[:512]
                log.warning("reconfigure of pod %s failed (%d): %s", uid, status, text)
        except channel.ChannelError as exc:
            log.warning("reconfigure of pod %s at %s: handshake failed: %s", uid, ip, exc)
            self.forget_data_plane_secret(instance_uid)
        except (OSError, TimeoutError) as exc:
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


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _secret_value(obj: dict[str, Any] | None) -> bytes | None:
    raw = ((obj or {}).get("data") or {}).get(names.DATA_PLANE_SECRET_KEY)
    if not raw:
        return None
    try:
        value = base64.b64decode(raw, validate=True).strip()
    except (binascii.Error, ValueError):
        return None
    return value if len(value) >= channel.MIN_SECRET_BYTES else None


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
