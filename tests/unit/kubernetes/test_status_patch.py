"""Status writes of the operator: merge patches that remove what is gone, restart accounting."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes.cluster import with_removals
from kubeserve.backends.kubernetes.pods import replica_key
from kubeserve.backends.kubernetes.status import (
    ApplicationRefused,
    ApplicationReport,
    DeploymentRoute,
    IngressRoute,
)
from kubeserve.control.status import AppStatusInfo, DeploymentStatusInfo


def test_map_entries_that_disappeared_are_deleted_by_the_patch() -> None:
    old = {"applications": {"a": {"status": "RUNNING"}, "gone": {"status": "RUNNING"}}, "x": 1}
    new = {"applications": {"a": {"status": "RUNNING"}}, "x": 2}
    assert with_removals(old, new) == {
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


def test_an_application_report_spells_routes_and_the_ingress_route() -> None:
    obj = {"metadata": {"generation": 3}}
    info = AppStatusInfo("RUNNING", "", {"Api": DeploymentStatusInfo("HEALTHY", "CONFIG_UPDATE")})
    report = ApplicationReport(
        info, {"Api": DeploymentRoute("app-api", 5, 2)}, IngressRoute("Api", "/api")
    )
    patch = report.patch(obj)
    assert patch["deployments"]["Api"] == {
        "status": "HEALTHY",
        "statusTrigger": "CONFIG_UPDATE",
        "message": "",
        "service": "app-api",
        "maxOngoingRequests": 5,
        "targetReplicas": 2,
    }
    assert (patch["ingressDeployment"], patch["routePrefix"]) == ("Api", "/api")
    assert patch["readyDeployments"] == "1/1"
    assert patch["conditions"][0]["reason"] == "Running"
    assert patch["observedGeneration"] == 3


def test_a_refused_application_keeps_its_deployments_and_names_the_reason() -> None:
    patch = ApplicationRefused("DeployFailed", "no pip here").patch({"metadata": {}})
    assert "deployments" not in patch  # the last reported deployments stay as they were
    assert patch["appStatus"] == "DEPLOY_FAILED"
    (ready,) = patch["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "DeployFailed",
        "no pip here",
    )
