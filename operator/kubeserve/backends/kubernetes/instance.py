"""Reconciling one ``ServeInstance``: its data-plane Secret, the data plane's RBAC and
NetworkPolicies, proxies, and what its status reports (:class:`~.status.InstanceReport`)."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes import names, render
from kubeserve.backends.kubernetes.context import OperatorContext, pod_ready
from kubeserve.backends.kubernetes.status import AppSummary, InstanceReport, ProxyReport


async def reconcile_instance(ctx: OperatorContext, obj: dict[str, Any]) -> InstanceReport:
    namespace = obj["metadata"]["namespace"]
    view = render.instance_view(obj)
    await ctx.data_plane_secret(obj)  # before the pods that read it
    wanted = [
        *render.render_dataplane_rbac(view),
        *render.render_instance_network_policies(view, ctx.operator_namespace),
        *render.render_proxy(view),
    ]
    for child in wanted:
        await ctx.apply(child)
    keep = {f"{c['kind']}/{c['metadata']['name']}" for c in wanted}
    labels = {
        names.INSTANCE_LABEL: names.label_value(obj["metadata"]["name"]),
        names.COMPONENT_LABEL: "proxy",
    }
    for kind in ("Deployment", "DaemonSet", "Service", "NetworkPolicy"):
        for child in ctx.cache.objects(kind, namespace, labels):
            if f"{kind}/{child['metadata']['name']}" not in keep:
                await ctx.kube.delete(kind, namespace, child["metadata"]["name"])
    return _instance_report(ctx, obj, labels)


def _instance_report(
    ctx: OperatorContext, obj: dict[str, Any], labels: dict[str, str]
) -> InstanceReport:
    namespace = obj["metadata"]["namespace"]
    proxies = {}
    for pod in ctx.cache.objects("Pod", namespace, labels):
        node = (pod.get("spec") or {}).get("nodeName") or pod["metadata"]["name"]
        proxies[node] = ProxyReport(
            node_id=node,
            node_ip=(pod.get("status") or {}).get("hostIP", ""),
            pod_uid=pod["metadata"]["uid"],
            pod_name=pod["metadata"]["name"],
            ready=pod_ready(pod),
        )
    applications = {}
    for app in ctx.cache.objects("ServeApplication", namespace):
        spec, status = app.get("spec") or {}, app.get("status") or {}
        if spec.get("instance", "default") != obj["metadata"]["name"]:
            continue
        applications[spec.get("appName") or app["metadata"]["name"]] = AppSummary(
            status=status.get("appStatus") or "NOT_STARTED",
            route_prefix=status.get("routePrefix"),
            message=status.get("message") or "",
        )
    location = (obj.get("spec") or {}).get("proxyLocation", "EveryNode")
    return InstanceReport(proxies, applications, proxies_disabled=location == "Disabled")
