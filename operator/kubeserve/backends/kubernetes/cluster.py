"""The operator's hands on the cluster: the API client, the caches, and writes of what changed.

Reconcilers read the cluster from :attr:`Cluster.cache` and write through :class:`Cluster`:
:meth:`Cluster.apply` remembers the digest of each object it applied and skips an identical
re-apply while the object still exists in the cache, and :meth:`Cluster.patch_status` skips a
status equal to the cached one. When nothing changes, a reconcile pass makes no API request.
A status moving into a failed state is announced once by a Warning Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.control import effective_config
from kubeserve.runtime.kubernetes.client import (
    Kube,
    KubeConflict,
    KubeError,
    KubeNotFound,
    timestamp,
)

log = logging.getLogger(__name__)

#: how long an object this process applied is taken to exist before the cache shows it
CACHE_LAG_S = 30.0

#: application states announced as Warning Events, with the Event's reason
_FAILED_STATES = {"DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}


@dataclass
class _Join:
    """The owners waiting to join one shared object, and the task patching them in."""

    owners: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the uids carried by the patch in flight
    sending: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    def waiting(self, uid: str) -> bool:
        return uid in self.owners or uid in self.sending


@dataclass
class _Leave:
    """The owners leaving one shared object (each with the key of its custom resource, whose
    next pass tries again if the patch fails), and the task patching them out."""

    owners: dict[str, str] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


@dataclass
class Cluster:
    kube: Kube
    cache: ClusterCache
    #: digest of the last object applied and when (monotonic), by kind/namespace/name
    applied: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: object uid -> the failed state last announced by an Event (a pass may still read the
    #: status it wrote before from a cache that lags; it must not announce the failure twice)
    _announced: dict[str, str] = field(default_factory=dict)
    #: the build (its name) each application (``ServeApplication/namespace/name``) last settled
    #: on, so it leaves its earlier builds once and the resync's digest covers the shared build
    builds: dict[str, str] = field(default_factory=dict)
    #: the owners waiting to join each shared object, and its one patch in flight
    _joins: dict[str, _Join] = field(default_factory=dict)
    #: the owners leaving each shared object, and its one patch in flight
    _leaves: dict[str, _Leave] = field(default_factory=dict)
    #: shared objects this process created: their first owner's uid and when (monotonic)
    _created: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: when this process made ``uid`` an owner of kind/namespace/name (monotonic): the passes
    #: before the cache shows it do not patch again
    _owned: dict[tuple[str, str], float] = field(default_factory=dict)

    async def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply of ``obj`` unless this process applied it in this form already and
        it exists: in the cache, or not yet there but applied less than :data:`CACHE_LAG_S` ago
        (a busy API server's watch lags its writes by seconds, and the passes in between would
        apply it again each)."""
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        digest = effective_config.fingerprint(obj)
        applied = self.applied.get(key)
        if applied is not None and applied[0] == digest:
            cached = self.cache.get(obj["kind"], meta.get("namespace", ""), meta["name"])
            if cached is not None or time.monotonic() < applied[1] + CACHE_LAG_S:
                return
        await self.kube.apply(obj)
        self.applied[key] = (digest, time.monotonic())

    async def create_owned(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` (whose one ownerReference is its first user), or, when another pass
        created it first, make that owner one of its owners: a shared object (a build) is never
        replaced, so two applications needing it at once both end up owning it."""
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta['namespace']}/{meta['name']}"
        owner = meta["ownerReferences"][0]
        created = self._created.get(key)
        if created is not None and time.monotonic() < created[1] + CACHE_LAG_S:
            # created by this process, not cached yet: its creator owns it; any other joins
            if created[0] != owner["uid"]:
                await self.add_owner(obj["kind"], meta["namespace"], meta["name"], None, owner)
            return
        try:
            await self.kube.create(obj["kind"], meta["namespace"], obj)
        except KubeConflict:
            await self.add_owner(obj["kind"], meta["namespace"], meta["name"], None, owner)
            return
        now = time.monotonic()
        if len(self._created) > 4096:  # only the recent ones are ever read
            self._created = {k: v for k, v in self._created.items() if now < v[1] + CACHE_LAG_S}
        self._created[key] = (str(owner["uid"]), now)

    async def add_owner(
        self,
        kind: str,
        namespace: str,
        name: str,
        cached: Mapping[str, Any] | None,
        owner: Mapping[str, Any],
    ) -> None:
        """Make ``owner`` (an ownerReference) one of the owners of an object shared by several
        custom resources, unless it is one already (in ``cached``, patched by this process less
        than :data:`CACHE_LAG_S` ago, or waiting for its patch). A strategic merge patch: the
        other owners are neither read nor rewritten. An object gone meanwhile is left to the
        next pass.

        Returns at once: the patch is sent by a task of the object's own, one patch at a time,
        carrying every owner that asked meanwhile. A thousand applications joining one build at
        once made a thousand concurrent patches of one object, which the API server serializes
        by retrying each (20-30 s apiece, some 504); batched, each patch of an object with
        hundreds of owners still took seconds, and the passes waiting on it held their turns
        (a pass needs the graph, which it has read, not its ownership of it)."""
        key = f"{kind}/{namespace}/{name}"
        uid = str(owner["uid"])
        if cached is not None and uid in _owner_uids(cached):
            self._owned.pop((key, uid), None)
            return
        if self.joining(key, uid):
            return
        now = time.monotonic()
        if len(self._owned) > 4096:  # stale entries (objects gone, cache never caught up)
            self._owned = {k: t for k, t in self._owned.items() if now < t + CACHE_LAG_S}
            self._joins = {k: j for k, j in self._joins.items() if j.task is not None}
        join = self._joins.setdefault(key, _Join())
        join.owners[uid] = dict(owner)
        if join.task is None:
            join.task = asyncio.ensure_future(self._send_joins(kind, namespace, name, join))

    def joining(self, key: str, uid: str) -> bool:
        """Whether ``uid`` is an owner of the shared object ``key`` (kind/namespace/name) as far
        as this process knows and its cache may not show yet: patched in less than
        :data:`CACHE_LAG_S` ago, or waiting for its patch."""
        if time.monotonic() < self._owned.get((key, uid), -CACHE_LAG_S) + CACHE_LAG_S:
            return True
        join = self._joins.get(key)
        return join is not None and join.waiting(uid)

    async def _send_joins(self, kind: str, namespace: str, name: str, join: _Join) -> None:
        """Patch the waiting owners of one object in, a batch at a time, until none wait. A
        failed patch is logged and its owners forgotten: their next passes ask again."""
        key = f"{kind}/{namespace}/{name}"
        try:
            while join.owners:
                owners, join.owners = join.owners, {}
                join.sending = set(owners)
                patch = {"metadata": {"ownerReferences": list(owners.values())}}
                try:
                    await self.kube.strategic_patch(kind, namespace, name, patch)
                except KubeNotFound:
                    continue
                except KubeError as exc:
                    log.warning("could not add %d owners to %s: %s", len(owners), key, exc)
                    continue
                done = time.monotonic()
                for joined in owners:
                    self._owned[(key, joined)] = done
        finally:
            join.sending = set()
            join.task = None
            if self._joins.get(key) is join and not join.owners:
                del self._joins[key]

    async def drop_owner(
        self, kind: str, obj: Mapping[str, Any], uid: str, retry_key: str = ""
    ) -> None:
        """``uid`` no longer uses the shared ``obj``: remove it from the owners, or delete the
        object when it was the last one (an object left without owners is never collected).

        Returns at once when others own it too: a task of the object's own patches the leaving
        owners out, one patch at a time carrying every owner that left meanwhile (a hundred
        applications leaving a build a thousand use made a hundred concurrent patches of one
        object, which the API server serialized at up to 34 s apiece, most of them 504). When
        that patch fails, ``retry_key`` (the custom resource's ``Kind/namespace/name``) is
        dropped from :attr:`builds`, so its next pass leaves again."""
        meta = obj["metadata"]
        owners = _owner_uids(obj)
        if uid not in owners:
            return
        if owners == [uid]:  # only the version read: an owner added meanwhile keeps it
            version = str(meta.get("resourceVersion") or "") or None
            with contextlib.suppress(KubeConflict):
                await self.kube.delete(
                    kind, meta["namespace"], meta["name"], resource_version=version
                )
            return
        key = f"{kind}/{meta['namespace']}/{meta['name']}"
        leave = self._leaves.setdefault(key, _Leave())
        leave.owners[uid] = retry_key
        if leave.task is None:
            leave.task = asyncio.ensure_future(
                self._send_leaves(kind, meta["namespace"], meta["name"], leave)
            )

    async def _send_leaves(self, kind: str, namespace: str, name: str, leave: _Leave) -> None:
        """Patch the leaving owners of one object out, a batch at a time, until none leave;
        when the batch holds every owner the cache shows, delete the object at that version."""
        key = f"{kind}/{namespace}/{name}"
        try:
            while leave.owners:
                owners, leave.owners = leave.owners, {}
                cached = self.cache.get(kind, namespace, name)
                try:
                    if cached is not None and set(_owner_uids(cached)) <= set(owners):
                        version = str(cached["metadata"].get("resourceVersion") or "") or None
                        await self.kube.delete(kind, namespace, name, resource_version=version)
                    else:
                        gone = [{"uid": uid, "$patch": "delete"} for uid in owners]
                        patch = {"metadata": {"ownerReferences": gone}}
                        await self.kube.strategic_patch(kind, namespace, name, patch)
                except KubeNotFound:
                    continue
                except KubeError as exc:  # a conflict too: an owner joined meanwhile
                    log.warning("could not remove %d owners of %s: %s", len(owners), key, exc)
                    for retry_key in owners.values():
                        self.builds.pop(retry_key, None)
        finally:
            leave.task = None
            if self._leaves.get(key) is leave and not leave.owners:
                del self._leaves[key]

    async def prune(
        self,
        namespace: str,
        labels: Mapping[str, str],
        kinds: Iterable[str],
        keep: Iterable[Mapping[str, Any]],
    ) -> None:
        """Delete the cached objects of ``kinds`` in ``namespace`` whose labels include
        ``labels``, except those of ``keep`` (what the pass applied): a reconciler's children
        that its spec no longer asks for."""
        kept = {(obj["kind"], obj["metadata"]["name"]) for obj in keep}
        for kind in kinds:
            for obj in self.cache.objects(kind, namespace, dict(labels)):
                if (kind, obj["metadata"]["name"]) not in kept:
                    await self.kube.delete(kind, namespace, obj["metadata"]["name"])

    def current_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The status of ``obj`` as cached (its latest version), without kopf's bookkeeping."""
        meta = obj["metadata"]
        current = self.cache.get(obj["kind"], meta["namespace"], meta["name"]) or obj
        return {k: v for k, v in (current.get("status") or {}).items() if k != "kopf"}

    async def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """Write ``status`` when it differs (whether it did); a move into a failed state is
        also an Event."""
        meta = obj["metadata"]
        old = self.current_status(obj)
        if all(old.get(k) == v for k, v in status.items()):
            return False
        failure = status.get("appStatus")
        if failure not in _FAILED_STATES:
            self._announced.pop(meta["uid"], None)
        elif old.get("appStatus") != failure and self._announced.get(meta["uid"]) != failure:
            self._announced[meta["uid"]] = failure
            await self.event(obj, _FAILED_STATES[failure], str(status.get("message") or failure))
        status = with_removals(old, status)
        await self.kube.merge_patch(
            obj["kind"], meta["namespace"], meta["name"], {"status": status}, "status"
        )
        return True

    async def event(
        self, obj: dict[str, Any], reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        """An Event on ``obj`` (``kubectl describe`` and dashboards show it): ``Warning`` for
        failures, ``Normal`` for what the operator did (a scale, say)."""
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
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "kubeserve-operator"},
            "firstTimestamp": timestamp(),
            "lastTimestamp": timestamp(),
            "count": 1,
        }
        try:
            await self.kube.create("Event", meta["namespace"], body)
        except KubeError as exc:  # an Event is best effort; the status already says it
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc)


def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
    return [str(o.get("uid")) for o in obj["metadata"].get("ownerReferences") or []]


def with_removals(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
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
