"""kopf handlers: thin. Every event on a custom resource runs the same idempotent reconcile.

Create, update and resume handlers call :meth:`Operator.reconcile`, which serialises passes per
object. Changes of owned objects (pods becoming ready, Jobs finishing) wake the affected objects'
reconcilers through the operator's caches, not through kopf; the periodic resync is the
operator's own too (a kopf timer would hold a finalizer on every object: a write when it is
created, another before it may go; kopf removes the one an earlier version left).
"""

from __future__ import annotations

from typing import Any

import kopf

from kubeserve.backends.kubernetes.operator import Operator
from kubeserve.schema.resources import GROUP, VERSION

#: the finalizer kopf adds when a handler needs one (none does: an earlier version's timers did)
FINALIZER = "kubeserve.io/finalizer"


def register(registry: kopf.OperatorRegistry, operator: Operator) -> None:
    """Register the handlers of ``operator`` in ``registry`` (one registry per operator run)."""

    async def reconcile(body: kopf.Body, **_: Any) -> None:
        await operator.reconcile_or_requeue(dict(body))

    for plural in ("serveinstances", "serveapplications"):
        for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
            on(GROUP, VERSION, plural, registry=registry, id="reconcile")(reconcile)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In a pod, the service account; elsewhere the kubeconfig (KUBECONFIG)."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.StatusProgressStorage(
            field="status.kopf.progress"
        )
        settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
            field="status.kopf.diffbase"
        )
        settings.posting.level = 30  # warnings and errors become Kubernetes Events
        settings.watching.server_timeout = 300
        # Watching a list of namespaces (exact names, never patterns), kopf would list and watch
        # every namespace of the cluster to learn which of them exist, a right the operator
        # need not hold; without scanning it takes the names as given (and scans the custom
        # resource definitions once, at start). Cluster-wide it lists no namespaces anyway.
        settings.scanning.disabled = bool(operator.settings.watch_namespaces)
        settings.watching.client_timeout = 330
