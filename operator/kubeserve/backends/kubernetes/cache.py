"""The operator's view of the cluster: informers over everything it owns and its custom resources.

Reconciliation reads from these caches, never from the API server directly, so a pass over an
application whose state did not change makes no API request at all. Every change of a cached
object calls ``on_change(kind, namespace)``, which the operator uses to wake the affected
reconcilers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

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


class ClusterCache:
    def __init__(
        self,
        kube: Kube,
        namespaces: list[str] | None,
        on_change: Callable[[str, set[str]], None],
    ) -> None:
        """``namespaces`` None watches the whole cluster."""
        self._kube = kube
        self._on_change = on_change
        self._informers: dict[tuple[str, str | None], Informer] = {}
        for kind, selector in WATCHED.items():
            for namespace in namespaces or [None]:  # type: ignore[list-item]
                self._informers[(kind, namespace)] = Informer(
                    kube, kind, namespace, self._changed(kind), selector
                )
        self._tasks: list[asyncio.Task[None]] = []

    def _changed(self, kind: str) -> Callable[[dict[str, dict[str, Any]]], None]:
        def changed(objects: dict[str, dict[str, Any]]) -> None:
            namespaces = {key.split("/", 1)[0] for key in objects}
            self._on_change(kind, namespaces)

        return changed

    async def start(self) -> None:
        self._tasks = [asyncio.ensure_future(i.run()) for i in self._informers.values()]
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def objects(
        self, kind: str, namespace: str, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Cached objects of ``kind`` in ``namespace`` whose labels include ``labels``."""
        found = []
        for (informer_kind, _), informer in self._informers.items():
            if informer_kind != kind:
                continue
            for obj in informer.objects.values():
                meta = obj["metadata"]
                if meta.get("namespace") != namespace:
                    continue
                own = meta.get("labels") or {}
                if labels and any(own.get(k) != v for k, v in labels.items()):
                    continue
                found.append(obj)
        return found

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [
            obj
            for (informer_kind, _), informer in self._informers.items()
            if informer_kind == kind
            for obj in informer.objects.values()
        ]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        for obj in self.objects(kind, namespace):
            if obj["metadata"]["name"] == name:
                return obj
        return None
