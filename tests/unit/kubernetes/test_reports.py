"""Status writes of the operator: the reports' patches through the status models, merge patches
that remove what is gone, restart accounting."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubeserve.backends.kubernetes.cluster import with_removals
from kubeserve.backends.kubernetes.details import DEPLOYED_AT_ANNOTATION
from kubeserve.backends.kubernetes.pods import exit_failure, replica_key
from kubeserve.backends.kubernetes.reports import (
    ApplicationRefused,
    ApplicationReport,
    AppSummary,
    IngressRoute,
    InstanceReport,
    ObservedDeployment,
    ProxyReport,
)
from kubeserve.control.details import ProcessView
from kubeserve.control.status_derivation import (
    AppStatusInfo,
    BuildView,
    DeploymentView,
    DerivedDeploymentStatus,
    ReplicaStateValue,
    ReplicaView,
    application_status,
)
from kubeserve.runtime.kubernetes.discovery import ready_elsewhere, snapshot_parts
from kubeserve.schema.resources import ServeApplicationStatus, ServeInstanceStatus


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
            "Frontend": DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED"),
            "Greeter": DerivedDeploymentStatus("UPDATING", "CONFIG_UPDATE_STARTED", "1/2 ready"),
        },
    )


def test_an_application_report_counts_replicas_and_names_the_route() -> None:
    deployments = {
        "Frontend": observed(1, "RUNNING"),
        "Greeter": observed(2, "RUNNING", "STARTING", "STOPPING"),
    }
    report = ApplicationReport(running_info(), deployments, IngressRoute("Frontend", "/"))
    patch = report.patch(application(generation=3))
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
    assert patch["replicas"] == "2/3"  # ready of target, every deployment
    assert (patch["ingressDeployment"], patch["routePrefix"]) == ("Frontend", "/")
    assert patch["conditions"][0]["reason"] == "Deploying"
    assert patch["observedGeneration"] == 3
    assert patch["docsPath"] is None  # not a FastAPI ingress
    ServeApplicationStatus.model_validate(patch)  # the CRD's shape


def test_the_data_plane_routes_by_the_status_the_operator_writes() -> None:
    """Written through the status model, read back by the data plane's TypedDict reader."""
    deployments = {"Frontend": observed(1, "RUNNING")}
    limits = {"max_queued_requests": 10, "backpressure_status": 503, "retry_after_s": 1.5}
    deployments["Greeter"] = ObservedDeployment(
        DeploymentView(1, [ReplicaView("RUNNING")]), "composed-greeter-svc", 7, None, limits
    )
    report = ApplicationReport(running_info(), deployments, IngressRoute("Frontend", "/api"))
    app = application(generation=3, **report.patch(application(generation=3)))
    app["spec"] = {"instance": "blue"}
    endpoint_slice = {
        "metadata": {"labels": {"kubernetes.io/service-name": "composed-greeter-svc"}},
        "ports": [{"port": 8000}],
        "endpoints": [
            {"addresses": ["10.0.0.5"], "conditions": {"ready": True}, "targetRef": {"name": "p"}}
        ],
    }
    routes, endpoints = snapshot_parts([app], [endpoint_slice], "blue")
    assert routes == [{"route_prefix": "/api", "app": "composed", "deployment": "Frontend"}]
    assert endpoints["composed#Greeter"] == {
        "max_ongoing_requests": 7,
        "replicas": [{"replica_id": "p", "host": "10.0.0.5", "port": 8000}],
        "max_queued_requests": 10,
        "backpressure_status": 503,
        "retry_after_s": 1.5,
    }
    assert snapshot_parts([app], [endpoint_slice], "default") == ([], {})


def test_a_leaving_proxy_waits_for_another_ready_pod_of_its_service() -> None:
    """``ready_elsewhere``: (a slice of the Service exists, another pod of it is ready)."""

    def endpoint(pod: str, ready: bool) -> dict[str, Any]:
        return {"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod}}  # fmt: skip

    def slices(*endpoints: dict[str, Any], service: str = "default-proxy") -> list[Any]:
        labels = {"kubernetes.io/service-name": service}
        return [{"metadata": {"labels": labels}, "endpoints": list(endpoints)}]

    # the leaving pod itself is not ready (it terminates); its replacement starts
    assert ready_elsewhere(
        slices(endpoint("old", False), endpoint("new", False)), "default-proxy", "old"
    ) == (True, False)
    assert ready_elsewhere(
        slices(endpoint("old", False), endpoint("new", True)), "default-proxy", "old"
    ) == (True, True)
    # a ready replica of some deployment is no proxy
    assert ready_elsewhere(
        slices(endpoint("replica", True), service="shop-model"), "default-proxy", "old"
    ) == (False, False)
    assert ready_elsewhere([], "default-proxy", "old") == (False, False)


def test_the_data_plane_reads_a_custom_request_router_from_the_status() -> None:
    spec = {
        "request_router_class": "routers:Mine",
        "request_router_kwargs": {"alpha": {"nested_key": 1}},  # user keys stay as given
        "request_routing_stats_period_s": 1.0,
        "request_routing_stats_timeout_s": 2.0,
        "initial_backoff_s": 0.025,
        "backoff_multiplier": 2.0,
        "max_backoff_s": 0.5,
    }
    greeter = ObservedDeployment(
        DeploymentView(1, [ReplicaView("RUNNING")]), "svc", 5, request_router=json.dumps(spec)
    )
    deployments = {"Frontend": observed(1, "RUNNING"), "Greeter": greeter}
    report = ApplicationReport(running_info(), deployments, IngressRoute("Frontend", "/api"))
    app = application(**report.patch(application()))
    ServeApplicationStatus.model_validate(report.patch(application()))
    _, endpoints = snapshot_parts([app], [], None)
    assert endpoints["composed#Greeter"]["request_router"] == spec
    assert "request_router" not in endpoints["composed#Frontend"]


def test_the_data_plane_refuses_at_once_a_deployment_that_failed_to_deploy() -> None:
    info = AppStatusInfo(
        "DEPLOY_FAILED",
        "deployment 'Greeter' failed",
        {
            "Frontend": DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED"),
            "Greeter": DerivedDeploymentStatus("DEPLOY_FAILED", "REPLICA_STARTUP_FAILED", "boom"),
        },
    )
    deployments = {"Frontend": observed(1, "RUNNING"), "Greeter": observed(1)}
    report = ApplicationReport(info, deployments, IngressRoute("Frontend", "/api"))
    app = application(**report.patch(application()))
    _, endpoints = snapshot_parts([app], [], None)
    assert "unavailable" not in endpoints["composed#Frontend"]
    reason = endpoints["composed#Greeter"]["unavailable"]
    assert "'composed' is DEPLOY_FAILED" in reason and "'Greeter'" in reason
    assert "boom" not in reason  # the error's text is the admin API's to show


@pytest.mark.parametrize("build", [BuildView("failed", "build Job composed-build-1 failed"),
                                   BuildView("running")])  # fmt: skip
def test_the_previous_version_keeps_its_route_while_a_rebuild_runs_or_after_it_failed(
    build: BuildView,
) -> None:
    """A pass with no graph of the new spec leaves the deployments and the route the status
    had: the proxies keep routing to the old replicas, which keep running."""
    info = AppStatusInfo(
        "RUNNING", "", {"Api": DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED")}
    )
    serving = ApplicationReport(info, {"Api": observed(1, "RUNNING")}, IngressRoute("Api", "/api"))
    app = application(**serving.patch(application()))
    patch = ApplicationReport(application_status(build, {})).patch(app)
    assert not {"deployments", "routePrefix", "ingressDeployment", "replicas"} & set(patch)
    status = ServeApplicationStatus.model_validate(patch)
    assert status.app_status == ("DEPLOY_FAILED" if build.state == "failed" else "DEPLOYING")
    app["status"] = {**app["status"], **with_removals(app["status"], patch)}
    routes, endpoints = snapshot_parts([app], [], None)
    assert routes == [{"route_prefix": "/api", "app": "composed", "deployment": "Api"}]
    assert "unavailable" not in endpoints["composed#Api"]


def test_a_running_application_report_is_ready() -> None:
    info = AppStatusInfo(
        "RUNNING", "", {"Api": DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED")}
    )
    report = ApplicationReport(info, {"Api": observed(1, "RUNNING")}, IngressRoute("Api", "/api"))
    patch = report.patch(application())
    assert patch["readyDeployments"] == "1/1"
    (ready,) = patch["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "Running")


def test_the_docs_path_of_a_fastapi_ingress_is_reported_and_cleared_without_one() -> None:
    info = AppStatusInfo(
        "RUNNING", "", {"Api": DerivedDeploymentStatus("HEALTHY", "CONFIG_UPDATE_COMPLETED")}
    )
    deployments = {"Api": observed(1, "RUNNING")}
    docs = ApplicationReport(info, deployments, IngressRoute("Api", "/api", "/docs"))
    assert docs.patch(application())["docsPath"] == "/docs"
    plain = ApplicationReport(info, deployments, IngressRoute("Api", "/api"))
    assert plain.patch(application())["docsPath"] is None  # a merge patch's null removes it


def test_last_deployed_time_is_the_admin_apis_annotation() -> None:
    obj = application()
    obj["metadata"]["annotations"] = {DEPLOYED_AT_ANNOTATION: "1700000000.5"}
    patch = ApplicationReport(AppStatusInfo("DEPLOYING")).patch(obj)
    assert patch["lastDeployedTime"] == "2023-11-14T22:13:20.500000Z"


def test_last_deployed_time_stays_while_the_generation_does() -> None:
    report = ApplicationReport(AppStatusInfo("DEPLOYING"))
    first = report.patch(application())
    seen = application(1, observedGeneration=1, lastDeployedTime="2026-01-01T00:00:00Z")
    assert report.patch(seen)["lastDeployedTime"] == "2026-01-01T00:00:00Z"
    changed = application(2, observedGeneration=1, lastDeployedTime="2026-01-01T00:00:00Z")
    assert report.patch(changed)["lastDeployedTime"] not in ("2026-01-01T00:00:00Z", None)
    assert first["lastDeployedTime"]


def test_a_refused_application_keeps_its_deployments_and_names_the_reason() -> None:
    patch = ApplicationRefused("DeployFailed", "no pip here").patch(application())
    assert "deployments" not in patch  # the last reported deployments stay as they were
    assert "routePrefix" not in patch
    assert patch["appStatus"] == "DEPLOY_FAILED"
    assert patch["lastDeployedTime"]
    (ready,) = patch["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "DeployFailed",
        "no pip here",
    )


def test_an_instance_report_describes_proxies_as_processes() -> None:
    process = ProcessView("node-1", "10.0.0.1", "uid-1", "proxy-abc", "")
    report = InstanceReport(
        {"node-1": ProxyReport(process, "proxy-abc", ready=True)},
        {"app": AppSummary("RUNNING", "/", "")},
        proxies_disabled=False,
    )
    patch = report.patch({"metadata": {"generation": 2}})
    assert patch["state"] == "RUNNING"
    assert patch["proxies"]["node-1"] == {
        "nodeId": "node-1",
        "nodeIp": "10.0.0.1",
        "actorId": "uid-1",
        "actorName": "proxy-abc",
        "workerId": "proxy-abc",
        "logFilePath": "",
        "status": "HEALTHY",
    }
    assert patch["applications"]["app"] == {"status": "RUNNING", "routePrefix": "/", "message": ""}
    assert patch["conditions"][0]["reason"] == "Running"
    ServeInstanceStatus.model_validate(patch)


def test_an_instance_status_stays_small_whatever_its_applications_say() -> None:
    """A thousand failed applications with long messages: the instance's status (one object)
    stays well within the API server's size limit; a few applications keep their messages."""
    failed = AppSummary("DEPLOY_FAILED", "/", "build failed: " + "x" * 4000)
    many = InstanceReport({}, {f"app-{i}": failed for i in range(1000)}, proxies_disabled=True)
    patch = many.patch({"metadata": {}})
    assert len(json.dumps(patch)) < 400_000
    message = patch["applications"]["app-7"]["message"]
    assert message.startswith("build failed: xxx") and message.endswith("\u2026")
    few = InstanceReport({}, {"a": failed, "b": AppSummary("RUNNING", "/b", "")}, True)
    patch = few.patch({"metadata": {}})
    assert len(patch["applications"]["a"]["message"]) == 1024
    assert patch["applications"]["b"]["message"] == ""


def test_an_instance_without_ready_proxies_is_starting() -> None:
    process = ProcessView("node-1", "", "uid-1", "proxy-abc", "")
    report = InstanceReport({"node-1": ProxyReport(process, "proxy-abc", ready=False)}, {}, False)
    patch = report.patch({"metadata": {}})
    assert (patch["state"], patch["message"]) == ("STARTING", "proxies starting")
    assert patch["proxies"]["node-1"]["status"] == "STARTING"


def proxy_pod(name: str, ready: bool, **container: Any) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    status = {"conditions": [condition], "containerStatuses": [{"name": "proxy", **container}]}
    return {"metadata": {"name": name}, "status": status}


def test_a_proxy_pod_that_exited_with_an_error_says_why_with_its_last_line() -> None:
    said = "usage: kubeserve proxy [-h] ...\nkubeserve proxy: error: tracing_config.x: bad\n"
    crashed = {"terminated": {"exitCode": 2, "reason": "Error", "message": said}}
    looping = proxy_pod("p-1", False, state={"waiting": {}}, lastState=crashed)
    assert exit_failure(looping) == (
        "pod p-1: exited with code 2: kubeserve proxy: error: tracing_config.x: bad"
    )
    killed = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    assert exit_failure(proxy_pod("p-2", False, state=killed)) == (
        "pod p-2: exited with code 137 (OOMKilled)"
    )
    # ready (it restarted and serves), still starting, ended cleanly, or going: no failure
    assert exit_failure(proxy_pod("p-3", True, lastState=crashed)) is None
    assert exit_failure(proxy_pod("p-4", False, state={"running": {}})) is None
    clean = {"terminated": {"exitCode": 0, "message": "bye"}}
    assert exit_failure(proxy_pod("p-5", False, state=clean)) is None
    going = proxy_pod("p-6", False, lastState=crashed)
    going["metadata"]["deletionTimestamp"] = "2026-11-26T12:00:00Z"
    assert exit_failure(going) is None


def test_an_instance_whose_proxy_fails_is_unhealthy_saying_why() -> None:
    """A proxy that cannot start (as Ray's, it does not serve without the tracing asked for)
    is not a silent CrashLoopBackOff: the instance is UNHEALTHY, its Ready condition
    ProxyFailed with the pod's reason, even beside a ready pod that still serves."""
    why = "pod p-new: exited with code 2: kubeserve proxy: error: tracing_config.x: bad"
    old = ProcessView("node-1", "", "uid-1", "p-old", "")
    failed = ProxyReport(ProcessView("node-2", "", "uid-2", "p-new", ""), "p-new", False, why)
    report = InstanceReport(
        {"node-1": ProxyReport(old, "p-old", ready=True), "node-2": failed},
        {"app": AppSummary("RUNNING", "/", "")},
        proxies_disabled=False,
        proxy_failures=(why, "pod p-other: exited with code 1"),
    )
    patch = report.patch({"metadata": {}})
    assert patch["state"] == "UNHEALTHY"
    assert patch["message"] == f"proxy not serving (and 1 other proxy pod): {why}"
    assert patch["proxies"]["node-1"]["status"] == "HEALTHY"
    assert patch["proxies"]["node-2"]["status"] == "UNHEALTHY"
    (ready,) = patch["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ProxyFailed",
        patch["message"],
    )
    ServeInstanceStatus.model_validate(patch)
