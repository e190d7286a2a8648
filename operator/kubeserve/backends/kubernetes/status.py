"""What a reconcile pass found, as typed reports, and the one place they become status patches.

A reconciler returns a report (:class:`ApplicationReport`, :class:`ApplicationRefused`,
:class:`InstanceReport`); :meth:`Operator.reconcile` turns it into the custom resource's status
with its ``patch`` method, the only code that spells status fields. The Ready condition
(:func:`ready_condition`) keeps its ``lastTransitionTime`` while its status does not change.
Deployment statuses come from observed pods (:func:`deployment_view_from_pods`) with the same
rules as the local backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeserve.backends.kubernetes import names
from kubeserve.backends.kubernetes.pods import pod_ready, replica_key
from kubeserve.control import config as config_rules
from kubeserve.control.status import AppStatusInfo, DeploymentView, ReplicaView
from kubeserve.runtime.kube import timestamp

#: Ready reasons of an application, by Ray status; any other status is ``Deploying``
_APP_REASONS = {"RUNNING": "Running", "DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}


@dataclass(frozen=True)
class DeploymentRoute:
    """How the data plane reaches one deployment: the Service whose EndpointSlices list its ready
    replicas, the cap on requests in flight per replica, and the replicas it should have."""

    service: str
    max_ongoing_requests: int
    target_replicas: int


@dataclass(frozen=True)
class IngressRoute:
    """Where an application's HTTP traffic enters: its ingress deployment and route prefix."""

    deployment: str
    route_prefix: str | None


@dataclass(frozen=True)
class ApplicationReport:
    """An application pass that reached its build: the status rules' answer, the route of each
    deployment in it, and the ingress once the graph is known (the build is done)."""

    info: AppStatusInfo
    routes: Mapping[str, DeploymentRoute] = field(default_factory=dict)
    ingress: IngressRoute | None = None

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        info = self.info
        deployments = {
            name: {
                "status": d.status,
                "statusTrigger": d.status_trigger,
                "message": d.message[:1024],
                "service": self.routes[name].service,
                "maxOngoingRequests": self.routes[name].max_ongoing_requests,
                "targetReplicas": self.routes[name].target_replicas,
            }
            for name, d in info.deployments.items()
        }
        healthy = sum(1 for d in info.deployments.values() if d.status == "HEALTHY")
        reason = _APP_REASONS.get(info.status, "Deploying")
        patch: dict[str, Any] = {
            "appStatus": info.status,
            "message": info.message[:4096],
            "observedGeneration": obj["metadata"].get("generation"),
            "readyDeployments": f"{healthy}/{len(info.deployments)}",
            "deployments": deployments,
            "conditions": [
                ready_condition(obj, info.status == "RUNNING", reason, info.message or info.status)
            ],
        }
        if self.ingress is not None:
            patch["ingressDeployment"] = self.ingress.deployment
            patch["routePrefix"] = self.ingress.route_prefix
        return patch


@dataclass(frozen=True)
class ApplicationRefused:
    """An application pass that stopped before its build: an invalid spec, a missing instance,
    a spec the renderer refuses. ``reason`` is the Ready condition's; the deployments last
    reported stay in the status as they were."""

    reason: str
    message: str
    app_status: str = "DEPLOY_FAILED"

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "appStatus": self.app_status,
            "message": self.message,
            "observedGeneration": obj["metadata"].get("generation"),
            "conditions": [ready_condition(obj, False, self.reason, self.message)],
        }


@dataclass(frozen=True)
class ProxyReport:
    """One proxy pod, keyed by its node in the instance status (Ray's ProxyDetails)."""

    node_id: str
    node_ip: str
    pod_uid: str
    pod_name: str
    ready: bool


@dataclass(frozen=True)
class AppSummary:
    """One application of an instance, as its own status says."""

    status: str
    route_prefix: str | None
    message: str


@dataclass(frozen=True)
class InstanceReport:
    """An instance pass: its proxies by node and its applications by name. Ready when every
    application is RUNNING and, unless ``proxyLocation: Disabled``, proxies exist and all are."""

    proxies: Mapping[str, ProxyReport]
    applications: Mapping[str, AppSummary]
    proxies_disabled: bool

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        proxies_ok = self.proxies_disabled or (
            bool(self.proxies) and all(p.ready for p in self.proxies.values())
        )
        apps_ok = all(a.status == "RUNNING" for a in self.applications.values())
        ready = proxies_ok and apps_ok
        message = (
            ""
            if ready
            else ("proxies starting" if not proxies_ok else "applications not all RUNNING")
        )
        return {
            "state": "RUNNING" if ready else "STARTING",
            "message": message,
            "observedGeneration": obj["metadata"].get("generation"),
            "proxies": {node: _proxy_status(p) for node, p in self.proxies.items()},
            "applications": {
                name: {
                    "status": a.status,
                    "routePrefix": a.route_prefix,
                    "message": a.message[:1024],
                }
                for name, a in self.applications.items()
            },
            "conditions": [
                ready_condition(
                    obj, ready, "Running" if ready else "Starting", message or "RUNNING"
                )
            ],
        }


#: What a reconciler returns; ``report.patch(obj)`` is the status to write.
StatusReport = ApplicationReport | ApplicationRefused | InstanceReport


def _proxy_status(proxy: ProxyReport) -> dict[str, Any]:
    return {
        "nodeId": proxy.node_id,
        "nodeIp": proxy.node_ip,
        "actorId": proxy.pod_uid,
        "actorName": proxy.pod_name,
        "workerId": proxy.pod_name,
        "logFilePath": "",
        "status": "HEALTHY" if proxy.ready else "STARTING",
    }


def ready_condition(
    obj: Mapping[str, Any], ready: bool, reason: str, message: str
) -> dict[str, Any]:
    """The ``Ready`` condition of ``obj``; ``lastTransitionTime`` moves only with its status."""
    old = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    status = "True" if ready else "False"
    if old is None or old.get("status") != status:
        since = timestamp()
    else:
        since = old.get("lastTransitionTime", timestamp())
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since,
        "observedGeneration": obj["metadata"].get("generation"),
    }


def deployment_view_from_pods(
    pods: list[dict[str, Any]],
    config: dict[str, Any],
    version: str,
    user_configs: Mapping[str, str],
    ever_healthy: bool = False,
) -> DeploymentView:
    """What the pods of one deployment are doing, as the backend-neutral status rules read it.

    ``user_configs`` maps a replica process (:func:`~.pods.replica_key`) to the user_config
    version it applied (:attr:`~.data_plane.DataPlane.user_configs`).

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
                config_applied=user_configs.get(replica_key(pod)) == uc_version,
            )
        )
    return DeploymentView(
        target_replicas=config_rules.target_replicas(config),
        replicas=replicas,
        startup_failures=restarts if not any(r.state == "RUNNING" for r in replicas) else 0,
        ever_healthy=ever_healthy,
        last_error=last_error,
    )
