"""What a replica in a Kubernetes pod learns from the cluster at start-up.

``user_config`` is never part of a pod template (changing it must not restart pods), so a replica
reads its deployment's override from its ``ServeApplication`` before it constructs the user's
class and reports ready; the operator pushes later changes to ``/-/reconfigure``.

The Kubernetes client is imported only when these functions run, so replicas on one machine do not
pay for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kubeserve.runtime.kubernetes.contract import (
    APPLICATION_ENV,
    DEFAULT_INSTANCE,
    DISCOVERY_ENV,
    DISCOVERY_KUBERNETES,
    INSTANCE_ENV,
    NAMESPACE_ENV,
)
from kubeserve.runtime.wire import CONTROLLER_URL_ENV

if TYPE_CHECKING:
    from kubeserve.runtime.handle_client import HandleClient


def in_cluster() -> bool:
    return os.environ.get(DISCOVERY_ENV) == DISCOVERY_KUBERNETES


async def user_config_override(deployment: str) -> tuple[bool, Any]:
    """``(True, value)`` when the application's spec overrides the deployment's user_config."""
    from kubeserve.runtime.kubernetes.client import (
        Kube,
    )  # only in a cluster: keeps local replicas light

    namespace, application = os.environ.get(NAMESPACE_ENV), os.environ.get(APPLICATION_ENV)
    if not namespace or not application:
        return False, None
    kube = await Kube.connect()
    try:
        obj = await kube.get("ServeApplication", namespace, application)
    finally:
        await kube.close()
    for entry in ((obj or {}).get("spec") or {}).get("deployments") or []:
        if entry.get("name") == deployment and "userConfig" in entry:
            return True, entry["userConfig"]
    return False, None


def handle_client(secret: bytes) -> HandleClient:
    """A handle client fed by the cluster's routes and EndpointSlices (not started); it reports
    what waits at it to the operator when the pod was given the operator's URL (scale to zero)."""
    from kubeserve.runtime.handle_client import HandleClient
    from kubeserve.runtime.kubernetes.discovery import KubeDiscovery

    namespace = os.environ.get(NAMESPACE_ENV, "default")
    source = KubeDiscovery(namespace)
    instance = os.environ.get(INSTANCE_ENV, DEFAULT_INSTANCE)
    return HandleClient(
        os.environ.get(CONTROLLER_URL_ENV) or None,
        source=source,
        secret=secret,
        scope=f"{namespace}/{instance}",
    )
