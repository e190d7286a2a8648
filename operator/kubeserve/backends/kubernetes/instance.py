"""Reconciling one ``ServeInstance``: its data-plane Secret, the data plane's RBAC and
NetworkPolicies, proxies, and the instance status."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes import names, render
from kubeserve.backends.kubernetes.context import OperatorContext, pod_ready
from kubeserve.backends.kubernetes.status import ready_condition


async def reconcile_instance(ctx: OperatorContext, obj: dict[str, Any]) -> None:
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
    await ctx.patch_status(obj, _instance_status(ctx, obj, labels))


def _instance_status(
    ctx: OperatorContext, obj: dict[str, Any], labels: dict[str, str]
) -> dict[str, Any]:
    namespace = obj["metadata"]["namespace"]
    proxies = {}
    for pod in ctx.cache.objects("Pod", namespace, labels):
        node = (pod.get("spec") or {}).get("nodeName") or pod["metadata"]["name"]
        proxies[node] = {
            "nodeId": node,
            "nodeIp": (pod.get("status") or {}).get("hostIP", ""),
            "actorId": pod["metadata"]["uid"],
            "actorName": pod["metadata"]["name"],
            "workerId": pod["metadata"]["name"],
            "logFilePath": "",
            "status": "HEALTHY" if pod_ready(pod) else "STARTING",
        }
    applications = {}
    for app in ctx.cache.objects("ServeApplication", namespace):
        spec, status = app.get("spec") or {}, app.get("status") or {}
        if spec.get("instance", "default") != obj["metadata"]["name"]:
            continue
        applications[spec.get("appName") or app["metadata"]["name"]] = {
            "status": status.get("appStatus") or "NOT_STARTED",
            "routePrefix": status.get("routePrefix"),
            "message": (status.get("message") or "")[:1024],
        }
    location = (obj.get("spec") or {}).get("proxyLocation", "EveryNode")
    proxies_ok = location == "Disabled" or (
        proxies and all(p["status"] == "HEALTHY" for p in proxies.values())
    )
    apps_ok = all(a["status"] == "RUNNING" for a in applications.values())
    ready = bool(proxies_ok and apps_ok)
    message = (
        "" if ready else ("proxies starting" if not proxies_ok else "applications not all RUNNING")
    )
    return {
        "state": "RUNNING" if ready else "STARTING",
        "message": message,
        "observedGeneration": obj["metadata"].get("generation"),
        "proxies": proxies,
        "applications": applications,
        "conditions": [
            ready_condition(
                obj, ready, "Running" if ready else "Starting", message or "RUNNING"
            ).model_dump(mode="json")
        ],
    }
