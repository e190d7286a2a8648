"""The operator's view of the cluster: informers over everything it owns and its custom resources.

Reconciliation reads from these caches, never from the API server directly, so a pass over an
application whose state did not change makes no API request at all. Every change of a cached
object calls ``on_change(kind, obj, old)`` with the object and the version it replaced (None when
it is new or gone: nothing to compare it with), which the operator uses to wake the reconcilers
it concerns.

The caches are indexed by namespace and by the labels that name an application, an instance or a
build Job (:data:`INDEX_LABELS`), so a pass reads its own children without walking the thousands
of pods of the other applications; and they keep only what the operator reads
(:func:`projected_pod`): with a thousand applications the pods are most of the process's memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Informer, Kube
from kubeserve.runtime.kubernetes.contract import MANAGED_SELECTOR

#: kind -> label selector; children are watched by the managed-by label only.
WATCHED: dict[str, str] = {
    "ServeInstance": "",
    "ServeApplication": "",
    "Deployment": MANAGED_SELECTOR,
    "DaemonSet": MANAGED_SELECTOR,
    "Service": MANAGED_SELECTOR,
    "Job": MANAGED_SELECTOR,
    "ConfigMap": MANAGED_SELECTOR,
    "Pod": MANAGED_SELECTOR,
    "ServiceAccount": MANAGED_SELECTOR,
    "Role": MANAGED_SELECTOR,
    "RoleBinding": MANAGED_SELECTOR,
    "NetworkPolicy": MANAGED_SELECTOR,
    "PodDisruptionBudget": MANAGED_SELECTOR,
}

#: the labels a lookup by which reads one bucket of the cache (the first of them a query has)
INDEX_LABELS = (contract.APPLICATION_LABEL, "job-name", contract.INSTANCE_LABEL)

#: what the operator and its admin API read of a pod's spec
_POD_SPEC_FIELDS = ("nodeName",)


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without ``metadata.managedFields`` (server-side apply's bookkeeping, often half
    an object, never read here)."""
    meta = obj.get("metadata") or {}
    if "managedFields" in meta:
        obj["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return obj


def projected_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as cached: its metadata and status, and of its spec only the fields read
    (:data:`_POD_SPEC_FIELDS`); its containers, volumes and env are its workload's."""
    spec = pod.get("spec") or {}
    pod["spec"] = {k: spec[k] for k in _POD_SPEC_FIELDS if k in spec}
    return without_managed_fields(pod)


class ClusterCache:
    def __init__(
        self,
        kube: Kube,
        namespaces: list[str] | None,
        on_change: Callable[[str, dict[str, Any], dict[str, Any] | None], None],
        on_deleted: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """``namespaces`` None watches the whole cluster; ``on_deleted(kind, obj)`` is called
        (after ``on_change``) for an object that is gone."""
        self._kube = kube
        self._on_change = on_change
        self._on_deleted = on_deleted
        self._informers: dict[str, list[Informer]] = {}
        for kind, selector in WATCHED.items():
            self._informers[kind] = [
                Informer(
                    kube,
                    kind,
                    namespace,
                    label_selector=selector,
                    on_event=self._changed(kind),
                    transform=projected_pod if kind == "Pod" else without_managed_fields,
                    index_labels=INDEX_LABELS,
                )
                for namespace in namespaces or [None]  # type: ignore[list-item]
            ]
        self._tasks: list[asyncio.Task[None]] = []

    def _changed(self, kind: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def changed(event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            self._on_change(kind, obj, None if event == "DELETED" else old)
            if event == "DELETED" and self._on_deleted is not None:
                self._on_deleted(kind, obj)

        return changed

    async def start(self) -> None:
        informers = [i for group in self._informers.values() for i in group]
        self._tasks = [asyncio.ensure_future(i.run()) for i in informers]
        await asyncio.gather(*(i.synced.wait() for i in informers))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def objects(
        self, kind: str, namespace: str, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Cached objects of ``kind`` in ``namespace`` whose labels include ``labels``."""
        wanted = labels or {}
        index = next((label for label in INDEX_LABELS if label in wanted), None)
        found = []
        for informer in self._informers[kind]:
            candidates = (
                informer.in_namespace(namespace)
                if index is None
                else informer.indexed(namespace, index, wanted[index])
            )
            for obj in candidates:
                own = obj["metadata"].get("labels") or {}
                if all(own.get(k) == v for k, v in wanted.items()):
                    found.append(obj)
        return found

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [obj for informer in self._informers[kind] for obj in informer.objects.values()]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = f"{namespace}/{name}"
        for informer in self._informers[kind]:
            obj = informer.objects.get(key)
            if obj is not None:
                return obj
        return None
