"""Routes and replica endpoints from the Kubernetes API, for proxies and handles in a cluster.

The same :class:`~kubeserve.runtime.wire.Snapshot` the local controller serves by long-poll is
assembled here from two watched sources in the process's namespace:

* ``ServeApplication`` status (written by the operator): route prefix, ingress deployment, and per
  deployment the Service listing its replicas and ``maxOngoingRequests``;
* ``EndpointSlice`` objects of those Services: the ready replica pods' addresses.

It needs only ``get/list/watch`` on ``serveapplications`` and ``endpointslices`` (the data plane's
Role).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from kubeserve.runtime import wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Informer, Kube

log = logging.getLogger(__name__)
_FIRST_SNAPSHOT_TIMEOUT_S = 10.0


class KubeDiscovery:
    """An :class:`~kubeserve.runtime.discovery.EndpointSource` over the Kubernetes API."""

    def __init__(
        self,
        namespace: str,
        instance: str | None = None,
        kubeconfig: str | None = None,
    ) -> None:
        """``instance`` limits routes to that ServeInstance's applications (proxies set it)."""
        self.namespace, self.instance, self.kubeconfig = namespace, instance, kubeconfig
        self._on_update: Callable[[wire.Snapshot], None] | None = None
        self._kube: Kube | None = None
        self._apps: dict[str, dict[str, Any]] = {}
        self._slices: dict[str, dict[str, Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._version = 0
        self._last: tuple[Any, Any] | None = None
        self._slices_changed = asyncio.Event()

    async def start(self, on_update: Callable[[wire.Snapshot], None]) -> None:
        self._on_update = on_update
        self._kube = await Kube.connect(self.kubeconfig)
        apps = Informer(self._kube, "ServeApplication", self.namespace, self._set_apps)
        slices = Informer(
            self._kube,
            "EndpointSlice",
            self.namespace,
            self._set_slices,
            contract.MANAGED_SELECTOR,
        )
        self._tasks = [asyncio.ensure_future(apps.run()), asyncio.ensure_future(slices.run())]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(apps.synced.wait(), slices.synced.wait()), _FIRST_SNAPSHOT_TIMEOUT_S
            )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    def _set_apps(self, objects: dict[str, dict[str, Any]]) -> None:
        self._apps = objects
        self._publish()

    def _set_slices(self, objects: dict[str, dict[str, Any]]) -> None:
        self._slices = objects
        self._slices_changed.set()
        self._publish()

    async def served_elsewhere(self, service: str, pod: str) -> None:
        """Returns once an EndpointSlice of ``service`` lists a ready endpoint of a pod other
        than ``pod`` (a leaving proxy's clients have another one to go to), or once the
        Service's slices are gone (it was deleted: nobody is to be served). The Service's slices
        carry its ``managed-by`` label, so the informer of replica slices sees them."""
        seen = False
        while True:
            found, elsewhere = ready_elsewhere(self._slices.values(), service, pod)
            seen = seen or found
            if elsewhere or (seen and not found):
                return
            self._slices_changed.clear()
            await self._slices_changed.wait()

    def _publish(self) -> None:
        routes, deployments = snapshot_parts(
            self._apps.values(), self._slices.values(), self.instance
        )
        if (routes, deployments) == self._last or self._on_update is None:
            return
        self._last = (routes, deployments)
        self._version += 1
        self._on_update({"version": self._version, "routes": routes, "deployments": deployments})


def ready_elsewhere(slices: Any, service: str, pod: str) -> tuple[bool, bool]:
    """Whether ``slices`` hold one of ``service``, and whether they list a ready endpoint of it
    that is not ``pod`` (pure)."""
    found = False
    for endpoint_slice in slices:
        labels = endpoint_slice["metadata"].get("labels") or {}
        if labels.get(contract.SERVICE_NAME_LABEL) != service:
            continue
        found = True
        for endpoint in endpoint_slice.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready")
            if ready and (endpoint.get("targetRef") or {}).get("name") != pod:
                return True, True
    return found, False


def snapshot_parts(
    apps: Any, slices: Any, instance: str | None
) -> tuple[list[wire.Route], dict[str, wire.DeploymentEndpoints]]:
    """Routes and endpoints from ServeApplication objects and EndpointSlices (pure)."""
    by_service: dict[str, list[wire.ReplicaEndpoint]] = {}
    for endpoint_slice in slices:
        service = (endpoint_slice["metadata"].get("labels") or {}).get(contract.SERVICE_NAME_LABEL)
        ports = endpoint_slice.get("ports") or []
        if not service or not ports:
            continue
        port = int(ports[0].get("port") or 0)
        for endpoint in endpoint_slice.get("endpoints") or []:
            if not (endpoint.get("conditions") or {}).get("ready"):
                continue
            target = (endpoint.get("targetRef") or {}).get("name") or endpoint["addresses"][0]
            for address in endpoint.get("addresses") or []:
                by_service.setdefault(service, []).append(
                    {"replica_id": str(target), "host": address, "port": port}
                )
    routes: list[wire.Route] = []
    deployments: dict[str, wire.DeploymentEndpoints] = {}
    for app in apps:
        if instance is not None and contract.instance_of(app) != instance:
            continue
        name, status = contract.application_name(app), contract.application_status(app)
        for deployment, entry in (status.get("deployments") or {}).items():
            service = entry.get("service")
            if not service:
                continue
            replicas = sorted(by_service.get(service, []), key=lambda r: r["replica_id"])
            endpoints: wire.DeploymentEndpoints = {
                "max_ongoing_requests": int(entry.get("maxOngoingRequests") or 5),
                "replicas": replicas,
            }
            if (queued := entry.get("maxQueuedRequests")) is not None:
                endpoints["max_queued_requests"] = int(queued)
            if (backpressure := entry.get("backpressureStatus")) is not None:
                endpoints["backpressure_status"] = int(backpressure)
            if (retry_after := entry.get("retryAfterS")) is not None:
                endpoints["retry_after_s"] = float(retry_after)
            if router := entry.get("requestRouter"):
                endpoints["request_router"] = json.loads(router)
            reason = wire.no_replica_coming(
                name, status.get("appStatus"), deployment, entry.get("status")
            )
            if reason is not None:
                endpoints["unavailable"] = reason
            deployments[wire.deployment_key(name, deployment)] = endpoints
        prefix, ingress = status.get("routePrefix"), status.get("ingressDeployment")
        if prefix and ingress:
            routes.append({"route_prefix": prefix, "app": name, "deployment": ingress})
    return routes, deployments
