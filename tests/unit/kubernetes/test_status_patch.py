"""Status writes of the operator: the ServeApplication status model, merge patches that remove
what is gone, restart accounting."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes.context import _with_removals, replica_key
from kubeserve.backends.kubernetes.details import DEPLOYED_AT_ANNOTATION
from kubeserve.backends.kubernetes.status import (
    Ingress,
    ObservedDeployment,
    application_status_patch,
    failed_status_patch,
)
from kubeserve.control.status import (
    AppStatusInfo,
    DeploymentStatusInfo,
    DeploymentView,
    ReplicaStateValue,
    ReplicaView,
)
from kubeserve.schema.resources import ServeApplicationStatus


def test_map_entries_that_disappeared_are_deleted_by_the_patch() -> None:
    old = {"applications": {"a": {"status": "RUNNING"}, "gone": {"status": "RUNNING"}}, "x": 1}
    new = {"applications": {"a": {"status": "RUNNING"}}, "x": 2}
    assert _with_removals(old, new) == {
        "applications": {"a": {"status": "RUNNING"}, "gone": None},
        "x": 2,
    }


def test_a_restarted_container_is_a_new_replica() -> None:
    def pod(restarts: int) -> dict[str, Any]:
        return {
            "metadata": {"uid": "u1"},
            "status": {"containerStatuses": [{"restartCount": restarts}]},
        }

    assert replica_key(pod(0)) != replica_key(pod(1))
    assert replica_key(pod(1)) == replica_key(pod(1))


def application(generation: int = 1, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "composed", "generation": generation}, "status": status}


def observed(target: int, *states: ReplicaStateValue) -> ObservedDeployment:
    replicas = [ReplicaView(state) for state in states]
    return ObservedDeployment(DeploymentView(target, replicas), "composed-greeter", 5)


def running_info() -> AppStatusInfo:
    return AppStatusInfo(
        "DEPLOYING",
        "",
        {
            "Frontend": DeploymentStatusInfo("HEALTHY", "CONFIG_UPDATE_COMPLETED"),
            "Greeter": DeploymentStatusInfo("UPDATING", "CONFIG_UPDATE_STARTED", "1/2 ready"),
        },
    )


def test_the_application_status_counts_replicas_and_names_the_route() -> None:
    deployments = {
        "Frontend": observed(1, "RUNNING"),
        "Greeter": observed(2, "RUNNING", "STARTING", "STOPPING"),
    }
    patch = application_status_patch(
        application(), running_info(), deployments, Ingress("Frontend", "/")
    )
    assert patch["deployments"]["Greeter"] == {
        "status": "UPDATING",
        "statusTrigger": "CONFIG_UPDATE_STARTED",
        "message": "1/2 ready",
        "replicas": 2,
        "readyReplicas": 1,
        "targetReplicas": 2,
        "service": "composed-greeter",
        "maxOngoingRequests": 5,
    }
    assert patch["readyDeployments"] == "1/2"
    assert (patch["ingressDeployment"], patch["routePrefix"]) == ("Frontend", "/")
    assert patch["conditions"][0]["reason"] == "Deploying"
    assert "docsPath" not in patch  # kubeserve serves no docs route
    ServeApplicationStatus.model_validate(patch)  # the CRD's shape


def test_last_deployed_time_is_the_admin_apis_annotation() -> None:
    obj = application()
    obj["metadata"]["annotations"] = {DEPLOYED_AT_ANNOTATION: "1700000000.5"}
    patch = application_status_patch(obj, AppStatusInfo("DEPLOYING"), {}, None)
    assert patch["lastDeployedTime"] == "2023-11-14T22:13:20.500000Z"


def test_last_deployed_time_stays_while_the_generation_does() -> None:
    first = application_status_patch(application(), AppStatusInfo("DEPLOYING"), {}, None)
    seen = application(1, observedGeneration=1, lastDeployedTime="2026-01-01T00:00:00Z")
    again = application_status_patch(seen, AppStatusInfo("DEPLOYING"), {}, None)
    assert again["lastDeployedTime"] == "2026-01-01T00:00:00Z"
    changed = application(2, observedGeneration=1, lastDeployedTime="2026-01-01T00:00:00Z")
    later = application_status_patch(changed, AppStatusInfo("DEPLOYING"), {}, None)
    assert later["lastDeployedTime"] not in ("2026-01-01T00:00:00Z", None)
    assert first["lastDeployedTime"]


def test_a_failure_before_the_graph_keeps_the_deployments_last_reported() -> None:
    patch = failed_status_patch(application(), "InvalidSpec", "spec.importPath: bad")
    assert patch["appStatus"] == "DEPLOY_FAILED"
    assert patch["conditions"][0]["status"] == "False"
    assert "deployments" not in patch and "routePrefix" not in patch
