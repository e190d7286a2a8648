"""``kubeserve proxy``, ``replica`` and ``build`` as a pod runs them: the composition root.

The data-plane commands (:mod:`kubeserve.runtime.proxy.command`, :mod:`kubeserve.runtime.replica.
command`, :mod:`kubeserve.runtime.build`) know nothing of Kubernetes; here they are given what a
cluster provides, from the environment the operator sets in its pods (:mod:`.contract`): a proxy's
discovery (``--discovery kubernetes``: routes of its instance's applications), a replica's handle
client and user_config override (when ``KUBESERVE_DISCOVERY`` says it runs in a cluster), a build
Job's graph writer and namespace, the metrics port of proxies and replicas. Outside a pod these
commands behave as the runtime's own (``python -m kubeserve.runtime.proxy`` and friends, which the
local backend runs).

Each function imports its command, and the Kubernetes client only once a process uses it, so a
replica does not load the proxy, and nothing on one machine loads the client.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from kubeserve.runtime.kubernetes.contract import (
    DEFAULT_INSTANCE,
    DISCOVERY_KUBERNETES,
    INSTANCE_ENV,
    METRICS_PORT_ENV,
    NAMESPACE_ENV,
    POD_NAME_ENV,
    proxy_name,
)

if TYPE_CHECKING:
    from kubeserve.runtime.discovery import EndpointSource
    from kubeserve.runtime.kubernetes.discovery import KubeDiscovery

__all__ = ["build", "proxy", "replica"]


def proxy(argv: list[str]) -> int:
    """``kubeserve proxy``: with ``--discovery kubernetes``, routes of the applications of the
    instance ``KUBESERVE_INSTANCE`` in the namespace ``KUBESERVE_NAMESPACE``."""
    from kubeserve.runtime.proxy.command import ClusterDiscovery, main

    namespace = os.environ.get(NAMESPACE_ENV, "default")
    instance = os.environ.get(INSTANCE_ENV)

    def source() -> KubeDiscovery:
        from kubeserve.runtime.kubernetes.discovery import KubeDiscovery

        return KubeDiscovery(namespace, instance)

    async def replaced(source: EndpointSource) -> None:
        """Another pod of the instance's proxy Service is ready (this one is leaving)."""
        from kubeserve.runtime.kubernetes.discovery import KubeDiscovery

        assert isinstance(source, KubeDiscovery)
        pod = os.environ.get(POD_NAME_ENV) or socket.gethostname()
        await source.served_elsewhere(proxy_name(instance or DEFAULT_INSTANCE), pod)

    scope = f"{namespace}/{instance}"
    cluster = ClusterDiscovery(DISCOVERY_KUBERNETES, source, scope, replaced)
    return main(argv, cluster=cluster, metrics_port=_metrics_port())


def replica(argv: list[str]) -> int:
    """``kubeserve replica``: in a cluster, handles fed by its discovery and the user_config its
    ``ServeApplication`` sets (see :mod:`.replica`)."""
    from kubeserve.runtime.kubernetes import replica as in_pod
    from kubeserve.runtime.replica.command import main
    from kubeserve.runtime.replica.server import ReplicaCluster

    cluster = None
    if in_pod.in_cluster():
        cluster = ReplicaCluster(in_pod.handle_client, in_pod.user_config_override)
    return main(argv, cluster=cluster, metrics_port=_metrics_port())


def build(argv: list[str]) -> int:
    """``kubeserve build``: ``--configmap`` writes the graph to that ConfigMap (:mod:`.graph`)."""
    from kubeserve.runtime.build import main

    return main(argv, write_graph=_write_graph, namespace=os.environ.get(NAMESPACE_ENV, "default"))


async def _write_graph(
    namespace: str, name: str, document: str, application: str, application_uid: str
) -> None:
    from kubeserve.runtime.kubernetes.graph import write_graph_configmap

    await write_graph_configmap(namespace, name, document, application, application_uid)


def _metrics_port() -> int | None:
    """The metrics port the operator gave this pod (``KUBESERVE_METRICS_PORT``), if any."""
    port = os.environ.get(METRICS_PORT_ENV)
    return int(port) if port else None
