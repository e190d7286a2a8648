"""Reconciling one ``ServeInstance``: its data-plane Secret, the data plane's RBAC and
NetworkPolicies, proxies, and the instance status."""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeserve.backends.kubernetes import names, render
from kubeserve.backends.kubernetes.context import OperatorContext, pod_ready
from kubeserve.backends.kubernetes.details import pod_process
from kubeserve.backends.kubernetes.status import ready_condition
from kubeserve.schema.resources import ServeInstanceStatus


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
    """``ServeInstance.status`` as a merge patch: its model's fields, every one set."""
    namespace = obj["metadata"]["namespace"]
    proxies = {}
    for pod in ctx.cache.objects("Pod", namespace, labels):
        process = pod_process(pod)
        proxies[process.node_id] = {
            **dataclasses.asdict(process),
            "actor_name": pod["metadata"]["name"],
            "status": "HEALTHY" if pod_ready(pod) else "STARTING",
        }
    applications = {}
    for app in ctx.cache.objects("ServeApplication", namespace):
        spec, status = app.get("spec") or {}, app.get("status") or {}
        if spec.get("instance", "default") != obj["metadata"]["name"]:
            continue
        applications[spec.get("appName") or app["metadata"]["name"]] = {
            "status": status.get("appStatus") or "NOT_STARTED",
            "route_prefix": status.get("routePrefix"),
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
    condition = ready_condition(
        obj, ready, "Running" if ready else "Starting", message or "RUNNING"
    )
    status = ServeInstanceStatus.model_validate(
        {
            "state": "RUNNING" if ready else "STARTING",
            "message": message,
            "observed_generation": obj["metadata"].get("generation"),
            "proxies": proxies,
            "applications": applications,
            "conditions": [condition],
        },
        by_name=True,
        by_alias=False,
    )
    return status.model_dump(mode="json", exclude_unset=True)
