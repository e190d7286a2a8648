"""The admin API's instances on Kubernetes: the ``ServeInstance`` of each watched namespace.

:class:`WatchedNamespaces` implements :class:`kubeserve.backends.protocol.Namespaces` for the
operator's admin server: the bare paths address the operator's own namespace, and
``/namespaces/<namespace>/...`` any namespace the operator watches (every one when it watches the
whole cluster). Its backends read the operator's caches, which hold exactly the watched
namespaces; a namespace outside them is a 404 naming the flag that adds it.

Ownership: one :class:`~.backend.KubernetesBackend` per namespace, made on first use and kept for
the life of the process, so the writes to one namespace's instance stay serialised by its lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubeserve.backends.kubernetes.backend import KubernetesBackend, LoadReportSink
from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.protocol import NotFoundError
from kubeserve.runtime.kubernetes.client import Kube

__all__ = ["WatchedNamespaces"]


class WatchedNamespaces:
    """The instances of ``watched`` (empty: the whole cluster) plus ``own``'s."""

    def __init__(
        self,
        kube: Kube,
        cache: ClusterCache,
        own: str,
        watched: Sequence[str] = (),
        reports: LoadReportSink | None = None,
    ) -> None:
        self._kube, self._cache, self._reports = kube, cache, reports
        self._own, self._watched = own, frozenset(watched)
        self._backends: dict[str, KubernetesBackend] = {}

    @property
    def own(self) -> str:
        return self._own

    def backend(self, namespace: str) -> KubernetesBackend:
        if self._watched and namespace not in self._watched and namespace != self._own:
            raise NotFoundError(
                f'namespace "{namespace}" is not watched by this kubeserve operator: it serves '
                "the ServeInstances of the namespaces it watches (its --watch-namespaces, the "
                "chart's watchNamespaces)"
            )
        backend = self._backends.get(namespace)
        if backend is None:
            backend = KubernetesBackend(self._kube, self._cache, namespace, reports=self._reports)
            self._backends[namespace] = backend
        return backend

    def names(self) -> list[str]:
        """The watched namespaces; watching the whole cluster, those holding a ServeInstance."""
        if self._watched:
            return sorted(self._watched | {self._own})
        found = {obj["metadata"]["namespace"] for obj in self._cache.all("ServeInstance")}
        return sorted(found | {self._own})
