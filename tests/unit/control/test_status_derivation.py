"""Replica states -> deployment status -> application status."""

from __future__ import annotations

from kubeserve.control.status_derivation import (
    STARTUP_FAILURE_THRESHOLD,
    BuildView,
    DeploymentView,
    ReplicaView,
    application_status,
    deployment_status,
)

RUNNING = ReplicaView("RUNNING")
STARTING = ReplicaView("STARTING")


def test_all_target_replicas_running_is_healthy() -> None:
    info = deployment_status(DeploymentView(2, [RUNNING, RUNNING]))
    assert info.status == "HEALTHY"
    assert info.status_trigger == "CONFIG_UPDATE_COMPLETED"


def test_starting_or_missing_replicas_are_updating() -> None:
    assert deployment_status(DeploymentView(2, [RUNNING, STARTING])).status == "UPDATING"
    assert deployment_status(DeploymentView(3, [RUNNING])).status == "UPDATING"
    assert deployment_status(DeploymentView(1, [RUNNING, RUNNING])).status == "UPDATING"


def test_stopping_replicas_do_not_count() -> None:
    info = deployment_status(DeploymentView(1, [RUNNING, ReplicaView("STOPPING")]))
    assert info.status == "HEALTHY"


def test_pending_user_config_or_old_version_is_updating() -> None:
    pending = ReplicaView("RUNNING", config_applied=False)
    assert deployment_status(DeploymentView(1, [pending])).status == "UPDATING"
    old = ReplicaView("RUNNING", current=False)
    assert deployment_status(DeploymentView(1, [old])).status == "UPDATING"


def test_failed_health_check_is_unhealthy_with_message() -> None:
    sick = ReplicaView("RUNNING", healthy=False)
    info = deployment_status(DeploymentView(1, [sick], last_error="boom"))
    assert (info.status, info.status_trigger, info.message) == (
        "UNHEALTHY",
        "HEALTH_CHECK_FAILED",
        "boom",
    )
    replacing = DeploymentView(1, [STARTING], health_error="replica r1 failed its health check")
    assert deployment_status(replacing).status == "UNHEALTHY"


def test_repeated_startup_failures_are_deploy_failed_until_ever_healthy() -> None:
    failing = DeploymentView(
        1, [STARTING], startup_failures=STARTUP_FAILURE_THRESHOLD, last_error="ctor raised"
    )
    info = deployment_status(failing)
    assert info.status == "DEPLOY_FAILED"
    assert "ctor raised" in info.message
    once_healthy = DeploymentView(
        1, [STARTING], startup_failures=STARTUP_FAILURE_THRESHOLD, ever_healthy=True
    )
    assert deployment_status(once_healthy).status == "UNHEALTHY"
    below = DeploymentView(1, [STARTING], startup_failures=STARTUP_FAILURE_THRESHOLD - 1)
    assert deployment_status(below).status == "UPDATING"


def test_application_status_from_build_and_deployments() -> None:
    healthy = {"A": DeploymentView(1, [RUNNING]), "B": DeploymentView(1, [RUNNING])}
    assert application_status(BuildView("running"), {}).status == "DEPLOYING"
    failed = application_status(BuildView("failed", "ImportError: no module x"), {})
    assert (failed.status, failed.message) == ("DEPLOY_FAILED", "ImportError: no module x")
    assert application_status(BuildView("done"), healthy).status == "RUNNING"
    # built, its deployments not there yet (the controller's next pass creates them): never a
    # RUNNING of nothing
    assert application_status(BuildView("done"), {}).status == "DEPLOYING"
    updating = {**healthy, "B": DeploymentView(2, [RUNNING])}
    assert application_status(BuildView("done"), updating).status == "DEPLOYING"
    sick = {**healthy, "B": DeploymentView(1, [ReplicaView("RUNNING", healthy=False)])}
    result = application_status(BuildView("done"), sick)
    assert result.status == "UNHEALTHY"
    assert "'B'" in result.message
    broken = {
        **healthy,
        "B": DeploymentView(1, [], startup_failures=STARTUP_FAILURE_THRESHOLD, last_error="x"),
    }
    assert application_status(BuildView("done"), broken).status == "DEPLOY_FAILED"
    assert application_status(BuildView("done"), healthy, deleting=True).status == "DELETING"


def test_replicas_that_keep_exiting_after_they_started_make_it_unhealthy() -> None:
    view = DeploymentView(
        target_replicas=1,
        replicas=[ReplicaView("STARTING")],
        failure_streak=3,
        last_error="replica X exited unexpectedly with code 4",
    )
    info = deployment_status(view)
    assert info.status == "UNHEALTHY"
    assert "keep exiting (3 failures in a row" in info.message
    assert "code 4" in info.message
    streak = DeploymentView(
        target_replicas=1, replicas=[ReplicaView("STARTING")], failure_streak=1, last_error="boom"
    )
    assert deployment_status(streak).status == "UPDATING"
    assert "boom" in deployment_status(streak).message
