"""A replica pod the kernel killed for its memory (``OOMKilled``) says so in its deployment's
status message, naming ``ray_actor_options.memory`` (the pod's ``resources.limits.memory``), as
a replica over its memory does on one machine."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes.pods import replica_key
from kubeserve.backends.kubernetes.reports import deployment_view_from_pods
from kubeserve.control.backoff import STABLE_AFTER_S
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.status_derivation import deployment_status

NOW = 1_764_110_000.0  # 2025-11-25T22:33:20Z
CONFIG = EffectiveDeployment(
    name="Hog", num_replicas=1, ray_actor_options={"memory": 200 * 1024**2}
)


def pod(ready: bool, terminated: dict[str, Any], *, crashed_now: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "replica", "ready": ready, "restartCount": 1}
    if crashed_now:
        container["state"] = {"terminated": terminated}
    else:
        container["state"] = {"running": {}}
        container["lastState"] = {"terminated": terminated}
    return {
        "metadata": {"name": "hog-7c9-abcde", "uid": "u-1", "annotations": {}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container],
        },
    }


def oom_killed(seconds_ago: float) -> dict[str, Any]:
    from datetime import UTC, datetime

    ended = datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"reason": "OOMKilled", "exitCode": 137, "finishedAt": ended}


def status_of(pods: list[dict[str, Any]], config: EffectiveDeployment = CONFIG) -> Any:
    applied = {replica_key(p): config.user_config_version for p in pods}
    view = deployment_view_from_pods(pods, config, "", applied, ever_healthy=True, now=NOW)
    return deployment_status(view)


def test_a_pod_restarted_after_oomkilled_names_the_memory_limit() -> None:
    status = status_of([pod(True, oom_killed(2))])
    assert status.status == "HEALTHY"
    assert "OutOfMemoryError" in status.message
    assert "memory limit of 200 MiB" in status.message
    assert "ray_actor_options.memory = 209715200 bytes" in status.message
    assert "resources.limits.memory (Kubernetes: OOMKilled)" in status.message


def test_a_pod_crashing_for_its_memory_names_the_limit_while_it_restarts() -> None:
    status = status_of([pod(False, oom_killed(0), crashed_now=True)])
    assert status.status != "HEALTHY"
    assert "memory limit of 200 MiB" in status.message and "OOMKilled" in status.message


def test_an_old_oomkill_is_forgotten_once_the_replica_served_a_while() -> None:
    status = status_of([pod(True, oom_killed(STABLE_AFTER_S + 1))])
    assert (status.status, status.message) == ("HEALTHY", "")


def test_without_a_memory_limit_the_node_ran_low() -> None:
    status = status_of([pod(True, oom_killed(1))], EffectiveDeployment(name="Hog"))
    assert "node running low on memory" in status.message


def test_another_exit_is_no_memory_message() -> None:
    crashed = {"reason": "Error", "exitCode": 1, "finishedAt": "2025-11-25T22:33:19Z"}
    status = status_of([pod(False, crashed, crashed_now=True)])
    assert "OutOfMemoryError" not in status.message


def test_a_failing_runtime_env_init_container_is_deploy_failed_with_the_installer_tail() -> None:
    tail = "error: No solution found when resolving dependencies\n  cause: no-such-pkg not found"
    failed = {"exitCode": 1, "reason": "Error", "message": tail}
    init = {"name": "runtime-env", "restartCount": 5, "lastState": {"terminated": failed}}
    init["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    replica = pod(False, {}, crashed_now=False)
    replica["status"]["containerStatuses"] = [
        {"name": "replica", "ready": False, "restartCount": 0, "state": {"waiting": {}}}
    ]
    replica["status"]["initContainerStatuses"] = [init]
    applied = {replica_key(replica): CONFIG.user_config_version}
    view = deployment_view_from_pods([replica], CONFIG, "", applied, now=NOW)
    status = deployment_status(view)
    assert status.status == "DEPLOY_FAILED", status
    assert "the runtime-env init container exited with code 1" in status.message
    assert "no-such-pkg not found" in status.message
