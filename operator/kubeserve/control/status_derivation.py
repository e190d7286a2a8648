"""Status derivation: replica observations -> deployment status -> application status.

Backends observe the world (processes, pods) and describe it with the plain views below; the status
values users see are computed here, the same way for every backend. Values are Ray Serve 2.60's.

Deployment status:

* ``DEPLOY_FAILED`` - replicas of the current version keep failing to start and none ever became
  healthy (a constructor that raises, an import that fails in the replica);
* ``UNHEALTHY`` - the version was healthy once, but now replicas fail health checks or keep dying,
  or replicas keep exiting soon after they started;
* ``HEALTHY`` - exactly the target number of replicas run the current version and have applied the
  current ``user_config``;
* ``UPDATING`` - anything else: starting, scaling, rolling to a new version, applying user_config.

Application status: ``DELETING`` while it is removed, ``DEPLOYING`` while its build runs,
``DEPLOY_FAILED`` when the build failed or a deployment is ``DEPLOY_FAILED``, ``UNHEALTHY`` when a
deployment is, ``RUNNING`` when every deployment is ``HEALTHY``, else ``DEPLOYING``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

DeploymentStatusValue = Literal["UPDATING", "HEALTHY", "UNHEALTHY", "DEPLOY_FAILED"]
AppStatusValue = Literal[
    "NOT_STARTED", "DEPLOYING", "DEPLOY_FAILED", "RUNNING", "UNHEALTHY", "DELETING"
]
ReplicaStateValue = Literal["STARTING", "UPDATING", "RECOVERING", "RUNNING", "STOPPING", "STOPPED"]

#: Consecutive failed starts of the current version after which a deployment is reported failed.
STARTUP_FAILURE_THRESHOLD = 3


@dataclass(frozen=True)
class ReplicaView:
    state: ReplicaStateValue
    #: runs the deployment's current version (code, environment, process options)
    current: bool = True
    #: ``False`` once a health check failed or timed out; such a replica is being replaced
    healthy: bool = True
    #: has applied the deployment's current ``user_config``
    config_applied: bool = True


@dataclass(frozen=True)
class DeploymentView:
    target_replicas: int
    replicas: Sequence[ReplicaView] = ()
    #: consecutive replicas of the current version that died before becoming RUNNING
    startup_failures: int = 0
    #: the current version reached HEALTHY at least once
    ever_healthy: bool = False
    #: the most recent failure (startup or health check), shown to the user
    last_error: str = ""
    #: set when a health check failed, until a replacement replica is serving again
    health_error: str = ""
    #: consecutive failures of any kind, exits of running replicas included (see ``backoff``)
    failure_streak: int = 0
    #: why some replicas are not started: they do not fit the resources (see ``placement``)
    unschedulable: str = ""
    #: why the custom autoscaling policy's last decision was not applied ("" when it was)
    autoscaling_error: str = ""


@dataclass(frozen=True)
class DerivedDeploymentStatus:
    status: DeploymentStatusValue
    status_trigger: str
    message: str = ""


@dataclass(frozen=True)
class BuildView:
    """The application's build: ``running``, ``failed`` (with the error) or ``done``."""

    state: Literal["running", "failed", "done"]
    error: str = ""
    #: what a running build is doing, when more than importing (installing packages)
    note: str = ""


@dataclass(frozen=True)
class AppStatusInfo:
    status: AppStatusValue
    message: str = ""
    deployments: dict[str, DerivedDeploymentStatus] = field(default_factory=dict)


def deployment_status(view: DeploymentView) -> DerivedDeploymentStatus:
    """The status of one deployment from what its replicas are doing; a failing autoscaling
    policy changes no status (the replicas serve on) but is said in the message."""
    derived = _replica_status(view)
    if not view.autoscaling_error:
        return derived
    message = "; ".join(m for m in (derived.message, view.autoscaling_error) if m)
    return DerivedDeploymentStatus(derived.status, derived.status_trigger, message)


def _replica_status(view: DeploymentView) -> DerivedDeploymentStatus:
    replicas = [r for r in view.replicas if r.state not in ("STOPPING", "STOPPED")]
    running_current = [r for r in replicas if r.state == "RUNNING" and r.current and r.healthy]
    if view.startup_failures >= STARTUP_FAILURE_THRESHOLD and not running_current:
        if view.ever_healthy:
            return DerivedDeploymentStatus("UNHEALTHY", "REPLICA_STARTUP_FAILED", view.last_error)
        return DerivedDeploymentStatus(
            "DEPLOY_FAILED",
            "REPLICA_STARTUP_FAILED",
            f"replicas failed to start {view.startup_failures} times in a row: {view.last_error}",
        )
    if view.failure_streak >= STARTUP_FAILURE_THRESHOLD and not running_current:
        return DerivedDeploymentStatus(
            "UNHEALTHY",
            "REPLICA_STARTUP_FAILED",
            f"replicas keep exiting ({view.failure_streak} failures in a row, restarts are "
            f"backing off): {view.last_error}",
        )
    if view.health_error or any(not r.healthy for r in replicas):
        message = view.health_error or view.last_error
        return DerivedDeploymentStatus("UNHEALTHY", "HEALTH_CHECK_FAILED", message)
    converged = (
        len(replicas) == view.target_replicas
        and len(running_current) == view.target_replicas
        and all(r.config_applied for r in running_current)
    )
    if converged:
        # until the replacement has served a while (the streak is forgotten then), say why a
        # replica was replaced: an OutOfMemoryError naming the limit, an exit code
        recovered = view.last_error if view.failure_streak else ""
        message = f"a replica was replaced after it failed: {recovered}" if recovered else ""
        return DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED", message)
    return DerivedDeploymentStatus(
        "UPDATING", "CONFIG_UPDATE_STARTED", _progress(view, running_current)
    )


def _progress(view: DeploymentView, running_current: Sequence[ReplicaView]) -> str:
    applied = sum(1 for r in running_current if r.config_applied)
    message = f"{applied}/{view.target_replicas} replicas ready"
    if view.unschedulable:
        message += f"; {view.unschedulable}"
    if view.last_error and (view.startup_failures or view.failure_streak):
        message += f"; last start failed: {view.last_error}"
    return message


def application_status(
    build: BuildView, deployments: dict[str, DeploymentView], *, deleting: bool = False
) -> AppStatusInfo:
    """The status of one application from its build and its deployments' statuses."""
    if deleting:
        return AppStatusInfo("DELETING")
    if build.state == "running":
        return AppStatusInfo("DEPLOYING", build.note or "building the application graph")
    if build.state == "failed":
        return AppStatusInfo("DEPLOY_FAILED", build.error)
    if not deployments:  # built, its deployments not created yet: an application has one
        return AppStatusInfo("DEPLOYING", "starting the deployments")
    infos = {name: deployment_status(view) for name, view in deployments.items()}
    failed = sorted(n for n, i in infos.items() if i.status == "DEPLOY_FAILED")
    if failed:
        message = "; ".join(f"deployment {n!r} failed: {infos[n].message}" for n in failed)
        return AppStatusInfo("DEPLOY_FAILED", message, infos)
    unhealthy = sorted(n for n, i in infos.items() if i.status == "UNHEALTHY")
    if unhealthy:
        message = "; ".join(f"deployment {n!r} is unhealthy: {infos[n].message}" for n in unhealthy)
        return AppStatusInfo("UNHEALTHY", message, infos)
    if all(i.status == "HEALTHY" for i in infos.values()):
        return AppStatusInfo("RUNNING", "", infos)
    return AppStatusInfo("DEPLOYING", "", infos)
