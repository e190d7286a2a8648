"""The operator process: caches, reconcilers and kopf, in one asyncio loop.

Ownership: the :class:`Operator` owns the API client, the caches and one lock per custom resource,
so two passes over the same object never overlap. kopf delivers custom-resource events; changes of
owned objects arrive through the caches and mark the custom resources of their namespace dirty; a
worker reconciles dirty objects from the cache. Either path runs the same idempotent function.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kubeserve.backends.kubernetes.application import reconcile_application
from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.kubernetes.context import OperatorContext
from kubeserve.backends.kubernetes.instance import reconcile_instance
from kubeserve.backends.kubernetes.metrics import metrics_text
from kubeserve.backends.kubernetes.status import StatusReport
from kubeserve.runtime.kube import Kube, KubeError

log = logging.getLogger(__name__)
_DEBOUNCE_S = 0.05


@dataclass(frozen=True)
class OperatorSettings:
    """Settings of ``kubeserve operator``, built once by the CLI."""

    #: the operator's own namespace (the admin API creates custom resources here)
    namespace: str
    #: namespaces to watch; empty means the whole cluster
    watch_namespaces: tuple[str, ...] = ()
    kubeconfig: str | None = None


class Operator:
    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._dirty: set[str] = set()
        self._wakeup = asyncio.Event()
        self.ctx: OperatorContext | None = None
        self._worker: asyncio.Task[None] | None = None
        self.reconciles = 0
        self.reconcile_errors = 0

    async def start(self) -> None:
        kube = await Kube.connect(self.settings.kubeconfig)
        namespaces = list(self.settings.watch_namespaces) or None
        cache = ClusterCache(kube, namespaces, self._changed)
        self.ctx = OperatorContext(kube, cache, self.settings.namespace)
        self.ctx.wake = self._wake_all  # type: ignore[method-assign]
        await cache.start()
        self._worker = asyncio.ensure_future(self._work())

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        if self.ctx is not None:
            await self.ctx.cache.close()
            await self.ctx.kube.close()

    async def reconcile(self, obj: dict[str, Any]) -> None:
        """One pass over a ServeInstance or ServeApplication (serialised per object)."""
        assert self.ctx is not None
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta['namespace']}/{meta['name']}"
        async with self._locks[key]:
            latest = self.ctx.cache.get(obj["kind"], meta["namespace"], meta["name"]) or obj
            if latest["metadata"].get("deletionTimestamp"):
                return  # children go with it (ownerReferences); nothing to converge to
            self.reconciles += 1
            try:
                report: StatusReport
                if obj["kind"] == "ServeInstance":
                    report = await reconcile_instance(self.ctx, latest)
                else:
                    report = await reconcile_application(self.ctx, latest)
                await self.ctx.patch_status(latest, report.patch(latest))
            except Exception:
                self.reconcile_errors += 1
                raise

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        assert self.ctx is not None
        return metrics_text(
            self.reconciles,
            self.reconcile_errors,
            self.ctx.kube.requests,
            self.ctx.cache.all("ServeApplication"),
        )

    def _changed(self, kind: str, namespaces: set[str]) -> None:
        if self.ctx is None:
            return
        for namespace in namespaces:
            for cr_kind in ("ServeInstance", "ServeApplication"):
                for obj in self.ctx.cache.objects(cr_kind, namespace):
                    self._dirty.add(f"{cr_kind}/{namespace}/{obj['metadata']['name']}")
        self._wakeup.set()

    def _wake_all(self) -> None:
        """Mark every custom resource dirty (after a user_config push completed, for example)."""
        if self.ctx is None:
            return
        for kind in ("ServeInstance", "ServeApplication"):
            for obj in self.ctx.cache.all(kind):
                meta = obj["metadata"]
                self._dirty.add(f"{kind}/{meta['namespace']}/{meta['name']}")
        self._wakeup.set()

    async def _work(self) -> None:
        assert self.ctx is not None
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(_DEBOUNCE_S)  # let a burst of pod events collapse into one pass
            self._wakeup.clear()
            dirty, self._dirty = self._dirty, set()
            for key in sorted(dirty):
                kind, namespace, name = key.split("/", 2)
                obj = self.ctx.cache.get(kind, namespace, name)
                if obj is None:
                    continue
                try:
                    await self.reconcile(obj)
                except KubeError as exc:
                    log.warning("reconcile of %s failed: %s (will retry)", key, exc)
                    self._dirty.add(key)
                except Exception:
                    log.exception("reconcile of %s failed", key)
