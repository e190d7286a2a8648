"""Custom-resource status from observed pods, computed with the same rules as the local backend.

Every ``ServeApplication`` status write is a
:class:`~kubeserve.schema.resources.ServeApplicationStatus` dumped with ``exclude_unset``: a patch
holds exactly the fields set here, so a failure before the graph is known
(:func:`failed_status_patch`) keeps the deployments and route last reported, and
:meth:`~kubeserve.backends.kubernetes.context.OperatorContext.patch_status` turns map entries that
are gone into deletions. ``docsPath`` is never written: kubeserve serves no API docs route (Ray
fills it for FastAPI ingresses), so the admin API reports ``docs_path`` null.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeserve.backends.kubernetes import names
from kubeserve.backends.kubernetes.context import OperatorContext, pod_ready, replica_key
from kubeserve.backends.kubernetes.details import annotated_deployed_at
from kubeserve.control import config as config_rules
from kubeserve.control.status import (
    AppStatusInfo,
    DeploymentStatusInfo,
    DeploymentView,
    ReplicaView,
)
from kubeserve.schema.resources import Condition, ServeApplicationStatus

__all__ = [
    "Ingress",
    "ObservedDeployment",
    "application_status_patch",
    "deployment_view_from_pods",
    "failed_status_patch",
    "ready_condition",
]

#: The ``Ready`` condition's reason for an application status (``Deploying`` for the others).
_READY_REASONS = {"RUNNING": "Running", "DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}


@dataclass(frozen=True)
class ObservedDeployment:
    """One serve deployment after a reconcile pass: what its pods do, and the data plane's routing
    inputs (the Service whose EndpointSlices list its ready replicas, the cap per replica)."""

    view: DeploymentView
    service: str
    max_ongoing_requests: int


@dataclass(frozen=True)
class Ingress:
    """Where an application's HTTP traffic enters: its ingress deployment and route."""

    deployment: str
    route_prefix: str | None


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


def ready_condition(obj: dict[str, Any], ready: bool, reason: str, message: str) -> Condition:
    """The ``Ready`` condition of ``obj``; its transition time moves only when ``ready`` does."""
    old = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    status = "True" if ready else "False"
    changed = old is None or old.get("status") != status
    return Condition.model_validate(
        {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "last_transition_time": _now() if changed else old.get("lastTransitionTime") or _now(),  # type: ignore[union-attr]
            "observed_generation": obj["metadata"].get("generation"),
        },
        by_name=True,
        by_alias=False,
    )


def failed_status_patch(
    obj: dict[str, Any], reason: str, message: str, app_status: str = "DEPLOY_FAILED"
) -> dict[str, Any]:
    """The application cannot be reconciled (its spec or its instance is wrong)."""
    return _patch(
        obj,
        app_status=app_status,
        message=message,
        conditions=[ready_condition(obj, False, reason, message)],
    )


def application_status_patch(
    obj: dict[str, Any],
    info: AppStatusInfo,
    deployments: Mapping[str, ObservedDeployment],
    ingress: Ingress | None,
) -> dict[str, Any]:
    """The application's derived status; ``deployments`` holds every deployment of ``info``
    (none while the graph builds), ``ingress`` is ``None`` until the graph is known."""
    healthy = sum(1 for d in info.deployments.values() if d.status == "HEALTHY")
    ready = info.status == "RUNNING"
    reason = _READY_REASONS.get(info.status, "Deploying")
    fields: dict[str, Any] = {
        "app_status": info.status,
        "message": info.message[:4096],
        "ready_deployments": f"{healthy}/{len(info.deployments)}",
        "deployments": {
            name: _deployment_entry(status, deployments[name])
            for name, status in info.deployments.items()
        },
        "conditions": [ready_condition(obj, ready, reason, info.message or info.status)],
    }
    if ingress is not None:
        fields.update(ingress_deployment=ingress.deployment, route_prefix=ingress.route_prefix)
    return _patch(obj, **fields)


def _deployment_entry(status: DeploymentStatusInfo, observed: ObservedDeployment) -> dict[str, Any]:
    live = [r for r in observed.view.replicas if r.state not in ("STOPPING", "STOPPED")]
    return {
        "status": status.status,
        "status_trigger": status.status_trigger,
        "message": status.message[:1024],
        "replicas": len(live),
        "ready_replicas": sum(1 for r in live if r.state == "RUNNING"),
        "target_replicas": observed.view.target_replicas,
        "service": observed.service,
        "max_ongoing_requests": observed.max_ongoing_requests,
    }


def _patch(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The status merge patch of ``fields`` (snake_case), with the generation it describes and
    when that generation was deployed."""
    status = ServeApplicationStatus.model_validate(
        {
            **fields,
            "observed_generation": obj["metadata"].get("generation"),
            "last_deployed_time": _deployed_time(obj),
        },
        by_name=True,
        by_alias=False,
    )
    return status.model_dump(mode="json", exclude_unset=True)


def _deployed_time(obj: dict[str, Any]) -> datetime:
    """When the current spec was deployed: the admin API's annotation, else when the operator
    first saw this generation (kept while the generation stays)."""
    annotated = annotated_deployed_at(obj)
    if annotated is not None:
        return datetime.fromtimestamp(annotated, UTC)
    old = obj.get("status") or {}
    if old.get("observedGeneration") == obj["metadata"].get("generation"):
        try:
            return datetime.fromisoformat(str(old["lastDeployedTime"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            pass
    return _now()


def _now() -> datetime:
    """Now, to the second (as Kubernetes writes times)."""
    return datetime.fromtimestamp(int(time.time()), UTC)
