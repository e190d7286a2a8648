"""What a reconcile pass found, as typed reports, and the one place they become status patches.

A reconciler returns a report (:class:`ApplicationReport`, :class:`ApplicationRefused`,
:class:`InstanceReport`); :meth:`Operator.reconcile` turns it into the custom resource's status
with its ``patch`` method, the only code that spells status fields. Every patch is the status
model (:class:`~kubeserve.schema.resources.ServeApplicationStatus`,
:class:`~kubeserve.schema.resources.ServeInstanceStatus`) dumped with ``exclude_unset``: it holds
exactly the fields a report sets, so a refused application, and one whose new build runs or
failed, keeps the deployments and route last reported (the previous version serves on), and
:meth:`~.cluster.Cluster.patch_status` turns map entries that are gone into deletions.
``docsPath`` is the ingress's FastAPI ``docs_url`` as the build found it (Ray's ``docs_path``),
unset for other ingresses.

The Ready condition (:func:`ready_condition`) keeps its ``lastTransitionTime`` while its status
does not change; ``lastDeployedTime`` is the admin API's deployed-at annotation, else when the
operator first saw the spec's generation. Deployment statuses come from observed pods
(:func:`deployment_view_from_pods`) with the same rules as the local backend.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeserve.backends.kubernetes.details import annotated_deployed_at
from kubeserve.backends.kubernetes.pods import last_exit, pod_ready, replica_key
from kubeserve.control import backoff
from kubeserve.control.details import ProcessView
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.replica_limits import (
    DEFAULT_MAX_PROCESSES,
    out_of_memory_message,
    replica_limits,
)
from kubeserve.control.status_derivation import (
    AppStatusInfo,
    DeploymentView,
    DerivedDeploymentStatus,
    ReplicaView,
)
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import timestamp
from kubeserve.schema.resources import (
    Condition,
    NodeSocketsStatus,
    ServeApplicationStatus,
    ServeInstanceStatus,
)

__all__ = [
    "AppSummary",
    "ApplicationRefused",
    "ApplicationReport",
    "IngressRoute",
    "InstanceReport",
    "ObservedDeployment",
    "ProxyReport",
    "StatusReport",
    "deployment_view_from_pods",
    "ready_condition",
]

#: Ready reasons of an application, by Ray status; any other status is ``Deploying``
_APP_REASONS = {"RUNNING": "Running", "DEPLOY_FAILED": "DeployFailed", "UNHEALTHY": "Unhealthy"}


@dataclass(frozen=True)
class ObservedDeployment:
    """One serve deployment after a reconcile pass: what its pods do (its replicas and the
    replicas it should have), and how the data plane reaches it: the Service whose
    EndpointSlices list its ready replicas, the cap on requests in flight per replica."""

    view: DeploymentView
    service: str
    max_ongoing_requests: int
    #: an autoscaling deployment's last change of target (Ray's ``ScalingDecision`` fields)
    last_scaling_decision: Mapping[str, Any] | None = None
    #: :func:`kubeserve.runtime.wire.queue_limits` of the deployment
    queue_limits: Mapping[str, Any] = field(default_factory=dict)
    #: :func:`kubeserve.runtime.wire.request_router_spec` of the deployment, as JSON
    request_router: str | None = None
    #: a ready replica of it has not said yet what it applied (:class:`ApplicationReport`)
    awaiting_first_answer: bool = False


@dataclass(frozen=True)
class IngressRoute:
    """Where an application's HTTP traffic enters: its ingress deployment and route prefix, and
    where a FastAPI ingress serves its docs (under the prefix), if it does."""

    deployment: str
    route_prefix: str | None
    docs_path: str | None = None


@dataclass(frozen=True)
class ApplicationReport:
    """An application pass that reached its build: the status rules' answer, each deployment of
    it as observed, and the ingress once the graph is known.

    While the build runs, and when it failed (or the config does not fit its graph), the pass
    touches no deployment: what runs is the previous version, which keeps serving as it was (as
    Ray's application keeps its deployments when a redeploy fails). ``deployments`` is ``None``
    then, and the patch leaves the deployments and the route last reported in the status, which
    is what the proxies route by: dropping them would leave the route with no replica behind it.
    """

    info: AppStatusInfo
    #: ``None``: no graph of the current spec yet (building, failed): the status keeps its own
    deployments: Mapping[str, ObservedDeployment] | None = None
    ingress: IngressRoute | None = None
    #: a ready replica has not said yet what it applied (this process just started): the status
    #: derived now would be a guess, so the recorded one stays until the replica answers
    provisional: bool = False

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        info = self.info
        reason = _APP_REASONS.get(info.status, "Deploying")
        fields: dict[str, Any] = {
            "app_status": info.status,
            "message": info.message[:4096],
            "conditions": [
                ready_condition(obj, info.status == "RUNNING", reason, info.message or info.status)
            ],
        }
        if self.deployments is not None:
            fields.update(self._deployment_fields(self.deployments))
        if self.ingress is not None:
            fields.update(
                ingress_deployment=self.ingress.deployment,
                route_prefix=self.ingress.route_prefix,
                docs_path=self.ingress.docs_path,
            )
        return _application_patch(obj, fields)

    def _deployment_fields(self, observed: Mapping[str, ObservedDeployment]) -> dict[str, Any]:
        """The status's deployment entries and their counts."""
        derived = self.info.deployments
        healthy = sum(1 for d in derived.values() if d.status == "HEALTHY")
        entries = {
            name: _deployment_entry(status, observed[name]) for name, status in derived.items()
        }
        ready = sum(e["ready_replicas"] for e in entries.values())
        target = sum(e["target_replicas"] for e in entries.values())
        return {
            "ready_deployments": f"{healthy}/{len(derived)}",
            "replicas": f"{ready}/{target}",
            "deployments": entries,
        }


@dataclass(frozen=True)
class ApplicationRefused:
    """An application pass that stopped before its build: an invalid spec, a missing instance,
    a spec the renderer refuses. ``reason`` is the Ready condition's; the deployments and route
    last reported stay in the status as they were."""

    reason: str
    message: str
    app_status: str = "DEPLOY_FAILED"

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        fields = {
            "app_status": self.app_status,
            "message": self.message,
            "conditions": [ready_condition(obj, False, self.reason, self.message)],
        }
        return _application_patch(obj, fields)


@dataclass(frozen=True)
class ProxyReport:
    """One proxy pod, keyed by its node in the instance status (Ray's ProxyDetails); the
    process is described as the admin API describes it (:func:`~.details.pod_process`)."""

    process: ProcessView
    pod_name: str
    ready: bool
    #: why the pod is not ready, when its proxy exited with an error
    #: (:func:`~.pods.exit_failure`): the proxy is UNHEALTHY, as Ray's that failed to start
    failure: str | None = None

    @property
    def status(self) -> str:
        """Ray's ``ProxyStatus`` of the proxy."""
        return "HEALTHY" if self.ready else "UNHEALTHY" if self.failure else "STARTING"


@dataclass(frozen=True)
class AppSummary:
    """One application of an instance, as its own status says."""

    status: str
    route_prefix: str | None
    message: str


@dataclass(frozen=True)
class InstanceReport:
    """An instance pass: its proxies by node and its applications by name. Ready when every
    application is RUNNING and, unless ``proxyLocation: Disabled``, proxies exist and all are.
    UNHEALTHY, saying why, when the proxies cannot be rendered (``problem``) or a proxy pod
    exited with an error (``proxy_failures``: a bad ``tracingConfig`` exporter, a gRPC servicer
    that does not import...), which otherwise would only be a pod in CrashLoopBackOff."""

    proxies: Mapping[str, ProxyReport]
    applications: Mapping[str, AppSummary]
    proxies_disabled: bool
    #: why the proxies cannot be rendered as the spec asks (its TLS Secret), if they cannot
    problem: str | None = None
    #: why each proxy pod that exited with an error did (one of a node may not be in ``proxies``:
    #: a ready one wins its node there, as a new pod failing beside the one it would replace)
    proxy_failures: tuple[str, ...] = ()
    #: whether the pods use node-local sockets, and why (``None``: not decided in this pass)
    node_sockets: NodeSocketsStatus | None = None

    def patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``ServeInstance.status`` as a merge patch: its model's fields, every one set."""
        proxies_ok = self.proxies_disabled or (
            bool(self.proxies)
            and all(p.ready for p in self.proxies.values())
            and not self.proxy_failures
        )
        apps_ok = all(a.status == "RUNNING" for a in self.applications.values())
        ready = proxies_ok and apps_ok and self.problem is None
        reason, message = self._why_not(proxies_ok) if not ready else ("Running", "")
        state = "RUNNING" if ready else "STARTING" if reason == "Starting" else "UNHEALTHY"
        limit = instance_message_limit(len(self.applications))
        status = ServeInstanceStatus.model_validate(
            {
                "state": state,
                "message": message,
                "observed_generation": obj["metadata"].get("generation"),
                "proxies": {node: _proxy_entry(p) for node, p in self.proxies.items()},
                "applications": {
                    name: {
                        "status": a.status,
                        "route_prefix": a.route_prefix,
                        "message": _clipped(a.message, limit),
                    }
                    for name, a in self.applications.items()
                },
                "conditions": [ready_condition(obj, ready, reason, message or "RUNNING")],
                **({"node_local_sockets": self.node_sockets} if self.node_sockets else {}),
            },
            by_name=True,
            by_alias=False,
        )
        return status.model_dump(mode="json", exclude_unset=True)

    def _why_not(self, proxies_ok: bool) -> tuple[str, str]:
        """The Ready condition's reason and the status message of an instance not ready."""
        if self.problem is not None:
            return "InvalidTLS", self.problem
        if self.proxy_failures:
            first, more = self.proxy_failures[0], len(self.proxy_failures) - 1
            also = f" (and {more} other proxy pod{'s' * (more > 1)})" if more else ""
            return "ProxyFailed", f"proxy not serving{also}: {first}"
        if not proxies_ok:
            return "Starting", "proxies starting"
        return "Starting", "applications not all RUNNING"


#: What the applications' messages in an instance's status may take together (characters): each
#: application's own status has its whole message; the instance's, one object whatever the number
#: of applications, must stay well within the API server's object size (etcd's 1.5 MiB request),
#: which a thousand failed applications' messages of 1,024 characters came close to.
INSTANCE_MESSAGES_BUDGET = 256 * 1024
#: ... but each gets this much at least, and never more than its own status's 1,024
_INSTANCE_MESSAGE_MIN, _INSTANCE_MESSAGE_MAX = 80, 1024


def instance_message_limit(applications: int) -> int:
    """How long each application's message in its instance's status may be."""
    share = INSTANCE_MESSAGES_BUDGET // max(1, applications)
    return max(_INSTANCE_MESSAGE_MIN, min(_INSTANCE_MESSAGE_MAX, share))


def _clipped(message: str, limit: int) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "\u2026"


#: What a reconciler returns; ``report.patch(obj)`` is the status to write.
StatusReport = ApplicationReport | ApplicationRefused | InstanceReport


def _deployment_entry(
    status: DerivedDeploymentStatus, observed: ObservedDeployment
) -> dict[str, Any]:
    """One deployment of ``ServeApplication.status``: replicas are its pods not terminating,
    ready replicas those ready."""
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
        **observed.queue_limits,
        **({} if observed.request_router is None else {"request_router": observed.request_router}),
        **(
            {}
            if observed.last_scaling_decision is None
            else {"last_scaling_decision": dict(observed.last_scaling_decision)}
        ),
    }


def _proxy_entry(proxy: ProxyReport) -> dict[str, Any]:
    return {
        **dataclasses.asdict(proxy.process),
        "actor_name": proxy.pod_name,
        "status": proxy.status,
    }


def _application_patch(obj: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``ServeApplication.status`` as a merge patch of ``fields`` (snake_case), with the
    generation it describes and when that generation was deployed."""
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


def _deployed_time(obj: Mapping[str, Any]) -> datetime:
    """When the current spec was deployed: the admin API's annotation, else when the operator
    first saw this generation (kept while the generation stays)."""
    annotated = annotated_deployed_at(obj)
    if annotated is not None:
        return datetime.fromtimestamp(annotated, UTC)
    old = ServeApplicationStatus.of(obj)
    if old.observed_generation == obj["metadata"].get("generation") and old.last_deployed_time:
        return old.last_deployed_time
    return datetime.fromisoformat(timestamp())


def ready_condition(obj: Mapping[str, Any], ready: bool, reason: str, message: str) -> Condition:
    """The ``Ready`` condition of ``obj``; ``lastTransitionTime`` moves only with its status."""
    old = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    status = "True" if ready else "False"
    if old is None or old.get("status") != status:
        since = timestamp()
    else:
        since = old.get("lastTransitionTime") or timestamp()
    return Condition.model_validate(
        {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "last_transition_time": since,
            "observed_generation": obj["metadata"].get("generation"),
        },
        by_name=True,
        by_alias=False,
    )


def deployment_view_from_pods(
    pods: list[dict[str, Any]],
    config: EffectiveDeployment,
    version: str,
    user_configs: Mapping[str, str],
    ever_healthy: bool = False,
    target_replicas: int | None = None,
    now: float | None = None,
) -> DeploymentView:
    """What the pods of one deployment are doing, as the backend-neutral status rules read it.

    A container the kernel killed for its memory (``OOMKilled``) is reported as Ray's
    ``OutOfMemoryError`` naming ``ray_actor_options.memory`` (the pod's memory limit), while it
    restarts and for :data:`~kubeserve.control.backoff.STABLE_AFTER_S` after it ended (at ``now``,
    epoch seconds), as a replica replaced on one machine is.

    ``user_configs`` maps a replica process (:func:`~.pods.replica_key`) to the user_config
    version it applied (:attr:`~.data_plane.DataPlane.user_configs`).

    Container restarts count as failed starts only while the version has never been healthy:
    afterwards a crashing replica makes the deployment UNHEALTHY, not DEPLOY_FAILED (as in Ray).
    """
    uc_version = config.user_config_version
    now = time.time() if now is None else now
    replicas = []
    restarts = recent_failures = 0
    last_error = ""
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            replicas.append(ReplicaView("STOPPING"))
            continue
        for container in status.get("containerStatuses") or []:
            restarts = max(restarts, int(container.get("restartCount", 0)))
            terminated = last_exit(container)
            if terminated and terminated.get("reason") == "OOMKilled":
                last_error = _out_of_memory(meta["name"], config)
                ended = _timestamp(terminated.get("finishedAt"))
                recent_failures += ended is None or now - ended < backoff.STABLE_AFTER_S
            elif terminated and not container.get("ready"):
                last_error = f"pod {meta['name']}: exited with code {terminated.get('exitCode')}"
        for init in status.get("initContainerStatuses") or []:
            restarts = max(restarts, int(init.get("restartCount", 0)))
            if (failure := _init_failure(init)) is not None:
                last_error = f"pod {meta['name']}: {failure}"
        pod_version = (meta.get("annotations") or {}).get(contract.VERSION_ANNOTATION, "")
        replicas.append(
            ReplicaView(
                "RUNNING" if pod_ready(pod) else "STARTING",
                current=pod_version == version,
                config_applied=user_configs.get(replica_key(pod)) == uc_version,
            )
        )
    return DeploymentView(
        target_replicas=(config.target_replicas() if target_replicas is None else target_replicas),
        replicas=replicas,
        startup_failures=restarts if not any(r.state == "RUNNING" for r in replicas) else 0,
        ever_healthy=ever_healthy,
        last_error=last_error,
        failure_streak=recent_failures,
    )


def init_failures(pod: Mapping[str, Any]) -> list[str]:
    """Why the pod's init containers failed (a build Job's pod, say), each with its log tail."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return [f for init in statuses if (f := _init_failure(init)) is not None]


def _init_failure(init: Mapping[str, Any]) -> str | None:
    """Why the pod's init container (runtime_env files and packages) failed, with the tail of its
    log (its termination message), or None when it did not fail."""
    terminated = last_exit(init)
    if not terminated or terminated.get("exitCode") in (0, None):
        return None
    message = str(terminated.get("message") or "").strip()[-2000:]
    what = f"the {init.get('name')} init container exited with code {terminated['exitCode']}"
    return f"{what}: {message}" if message else what


def _out_of_memory(pod_name: str, config: EffectiveDeployment) -> str:
    limits = replica_limits(config, DEFAULT_MAX_PROCESSES)
    enforced_by = "the pod's resources.limits.memory (Kubernetes: OOMKilled)"
    if limits.memory_bytes is None:
        enforced_by = "Kubernetes: OOMKilled"
    return out_of_memory_message(f"pod {pod_name}", limits, enforced_by, None)


def _timestamp(value: object) -> float | None:
    """An RFC 3339 time of the API server (``2026-11-25T22:31:39Z``) in epoch seconds."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
