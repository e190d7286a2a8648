"""Reconciling one ``ServeInstance``: its data-plane Secret, the data plane's RBAC and
NetworkPolicies, proxies, and what its status reports (:class:`~.reports.InstanceReport`)."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes import render
from kubeserve.backends.kubernetes.cluster import Cluster
from kubeserve.backends.kubernetes.data_plane import DataPlane
from kubeserve.backends.kubernetes.details import pod_process
from kubeserve.backends.kubernetes.pods import exit_failure, pod_ready
from kubeserve.backends.kubernetes.reports import AppSummary, InstanceReport, ProxyReport
from kubeserve.backends.kubernetes.tls_secret import tls_problem
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.resources import NodeSocketsStatus, ServeApplicationStatus

#: The kinds of the proxies' objects (a DaemonSet for ``EveryNode``).
_PROXY_KINDS = ("Deployment", "DaemonSet", "Service", "NetworkPolicy")


class InstanceReconciler:
    """The operator's one idempotent step for a ``ServeInstance``; holds no state of its own."""

    def __init__(self, cluster: Cluster, data_plane: DataPlane, operator_namespace: str) -> None:
        self._cluster = cluster
        self._data_plane = data_plane
        #: the operator's own namespace (its pods may reach replicas: see the NetworkPolicies)
        self._operator_namespace = operator_namespace

    async def reconcile(self, obj: dict[str, Any]) -> InstanceReport:
        """Converge ``obj``'s children to its spec; what its status should say."""
        cluster, namespace = self._cluster, obj["metadata"]["namespace"]
        view = self._data_plane.instance_view(obj)
        await self._data_plane.secret(obj)  # before the pods that read it
        problem = await tls_problem(
            self._data_plane.kube, namespace, view.tls, view.spec.rest_options()
        )
        wanted = [
            *render.render_dataplane_rbac(view),
            *render.render_instance_network_policies(view, self._operator_namespace),
        ]
        for child in wanted:
            await cluster.apply(child)
        # asked once its service account exists (the probe pod runs as it)
        sockets = await self._data_plane.node_sockets(obj)
        if problem is None:  # else the proxies running keep serving, and none starts
            proxies = render.render_proxy(self._data_plane.instance_view(obj))
            for child in proxies:
                await cluster.apply(child)
            wanted += proxies
        labels = {
            contract.INSTANCE_LABEL: contract.label_value(obj["metadata"]["name"]),
            contract.COMPONENT_LABEL: "proxy",
        }
        if problem is None:
            await cluster.prune(namespace, labels, _PROXY_KINDS, wanted)
        return _instance_report(cluster, obj, labels, problem, sockets)


def _instance_report(
    cluster: Cluster,
    obj: dict[str, Any],
    labels: dict[str, str],
    problem: str | None,
    sockets: NodeSocketsStatus,
) -> InstanceReport:
    namespace = obj["metadata"]["namespace"]
    proxies, failures = {}, []
    for pod in sorted(cluster.cache.objects("Pod", namespace, labels), key=pod_ready):
        process = pod_process(pod)  # the admin API describes a proxy pod the same way
        failure = exit_failure(pod)
        proxies[process.node_id] = ProxyReport(  # a ready pod wins its node
            process, pod_name=pod["metadata"]["name"], ready=pod_ready(pod), failure=failure
        )
        if failure is not None:
            failures.append(failure)
    applications = {}
    for app in cluster.cache.objects("ServeApplication", namespace):
        if contract.instance_of(app) != obj["metadata"]["name"]:
            continue
        status = ServeApplicationStatus.of(app)
        applications[contract.application_name(app)] = AppSummary(
            status=str(status.app_status or "NOT_STARTED"),
            route_prefix=status.route_prefix,
            message=status.message,
        )
    location = (obj.get("spec") or {}).get("proxyLocation", "EveryNode")
    return InstanceReport(
        proxies,
        applications,
        proxies_disabled=location == "Disabled",
        problem=problem,
        proxy_failures=tuple(sorted(failures)),
        node_sockets=sockets,
    )
