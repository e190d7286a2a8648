"""Custom-resource status from observed pods, computed with the same rules as the local backend."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kubeserve.backends.kubernetes import names
from kubeserve.backends.kubernetes.context import OperatorContext, pod_ready, replica_key
from kubeserve.control import config as config_rules
from kubeserve.control.status import AppStatusInfo, DeploymentView, ReplicaView


def deployment_view_from_pods(
    ctx: OperatorContext,
    pods: list[dict[str, Any]],
    config: dict[str, Any],
    version: str,
    ever_healthy: bool = False,
) -> DeploymentView:
    """What the pods of one deployment are doing, as the backend-neutral status rules read it.

    Container restarts count as failed starts only while the version has never been healthy:
    afterwards a crashing replica makes the deployment UNHEALTHY, not DEPLOY_FAILED (as in Ray).
    """
    uc_version = config_rules.user_config_version(config)
    replicas = []
    restarts = 0
    last_error = ""
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            replicas.append(ReplicaView("STOPPING"))
            continue
        for container in status.get("containerStatuses") or []:
            restarts = max(restarts, int(container.get("restartCount", 0)))
            terminated = (container.get("lastState") or {}).get("terminated")
            if terminated and not container.get("ready"):
                last_error = f"pod {meta['name']}: exited with code {terminated.get('exitCode')}"
        pod_version = (meta.get("annotations") or {}).get(names.VERSION_ANNOTATION, "")
        replicas.append(
            ReplicaView(
                "RUNNING" if pod_ready(pod) else "STARTING",
                current=pod_version == version,
                config_applied=ctx.user_configs.get(replica_key(pod)) == uc_version,
            )
        )
    return DeploymentView(
        target_replicas=config_rules.target_replicas(config),
        replicas=replicas,
        startup_failures=restarts if not any(r.state == "RUNNING" for r in replicas) else 0,
        ever_healthy=ever_healthy,
        last_error=last_error,
    )


def _condition(obj: dict[str, Any], ready: bool, reason: str, message: str) -> dict[str, Any]:
    old = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    status = "True" if ready else "False"
    changed = old is None or old.get("status") != status
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": _now() if changed else old.get("lastTransitionTime", _now()),  # type: ignore[union-attr]
        "observedGeneration": obj["metadata"].get("generation"),
    }


def _now() -> str:
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def failed_status_patch(
    obj: dict[str, Any], reason: str, message: str, app_status: str = "DEPLOY_FAILED"
) -> dict[str, Any]:
    return {
        "appStatus": app_status,
        "message": message,
        "observedGeneration": obj["metadata"].get("generation"),
        "conditions": [_condition(obj, False, reason, message)],
    }


def application_status_patch(
    obj: dict[str, Any],
    info: AppStatusInfo,
    app_config: dict[str, Any],
    routing: dict[str, Any],
    ingress: str | None,
) -> dict[str, Any]:
    deployments = {
        name: {
            "status": d.status,
            "statusTrigger": d.status_trigger,
            "message": d.message[:1024],
            "service": routing[name]["service"],
            "maxOngoingRequests": routing[name]["max_ongoing_requests"],
            "targetReplicas": routing[name]["target"],
        }
        for name, d in info.deployments.items()
    }
    healthy = sum(1 for d in info.deployments.values() if d.status == "HEALTHY")
    ready = info.status == "RUNNING"
    reason = {"RUNNING": "Running", "DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}.get(
        info.status, "Deploying"
    )
    patch: dict[str, Any] = {
        "appStatus": info.status,
        "message": info.message[:4096],
        "observedGeneration": obj["metadata"].get("generation"),
        "readyDeployments": f"{healthy}/{len(info.deployments)}",
        "deployments": deployments,
        "conditions": [_condition(obj, ready, reason, info.message or info.status)],
    }
    if ingress is not None:
        patch["ingressDeployment"] = ingress
        patch["routePrefix"] = routing.get("__route__", {}).get("route_prefix")
    del app_config
    return patch
