"""What a backend observes -> GET /api/serve/applications/ and .../deployments/status bodies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema

from kubeserve.control.details import (
    ApplicationDetailsView,
    ControllerHealth,
    DeploymentDetailsView,
    InstanceDetailsView,
    ProcessView,
    ProxyView,
    ReplicaProcessView,
    controller_process,
    details_body,
    details_json,
    instance_details,
    single_app_status,
)
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.rollout import SIDE_BY_SIDE
from kubeserve.schema.status import empty_instance_details

REFERENCE = Path(__file__).resolve().parents[2] / "reference" / "ray-2.60"
RAY_DETAILS_SCHEMA = json.loads((REFERENCE / "ServeInstanceDetails.json").read_text())

OPTIONS: dict[str, Any] = {
    "proxy_location": "HeadOnly",
    "http_options": {"host": "127.0.0.1", "port": 8000},
    "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
    "target_capacity": None,
}
GRAPH = {
    "ingress": "Frontend",
    "deployments": [
        {"name": "Frontend", "is_ingress": True, "outbound": ["Greeter"]},
        {"name": "Greeter"},
    ],
}
CONFIG = {"name": "composed", "import_path": "examples.composed:app", "route_prefix": "/"}
GREETER_CONFIG = EffectiveDeployment(
    name="Greeter",
    num_replicas=2,
    max_ongoing_requests=5,
    user_config={"greeting": "Hi"},
    ray_actor_options={"num_cpus": 0.5},
)


def node_process(actor_id: str) -> ProcessView:
    return ProcessView("node-1", "10.0.0.1", actor_id, actor_id, "")


def composed_view(**app: Any) -> InstanceDetailsView:
    replica = ReplicaProcessView(node_process("r1"), "r1", "RUNNING", 4242, 1700000000.0)
    greeter = DeploymentDetailsView(
        "Greeter", GREETER_CONFIG, 2, [replica], "HEALTHY", "CONFIG_UPDATE_COMPLETED"
    )
    frontend = DeploymentDetailsView("Frontend", EffectiveDeployment("Frontend"), 1)
    fields: dict[str, Any] = {
        "name": "composed",
        "route_prefix": "/",
        "status": "DEPLOYING",
        "message": "",
        "deployed_at": 1700000000.5,
        "config": CONFIG,
        "deployments": [frontend, greeter],
        "graph": GRAPH,
        **app,
    }
    return InstanceDetailsView(
        controller=controller_process("node-1", "10.0.0.1", 7, "/var/log/controller.log"),
        options=OPTIONS,
        proxies={"node-1": ProxyView(node_process("p1"), "HEALTHY")},
        applications=[ApplicationDetailsView(**fields)],
    )


def test_nothing_running_is_rays_empty_answer() -> None:
    """The body itself is pinned in tests/unit/schema/test_schema_status.py."""
    assert details_body(instance_details(None)) == details_body(empty_instance_details())


def test_a_running_instance_answers_in_rays_schema_with_rays_actor_names() -> None:
    body = details_body(instance_details(composed_view()))
    jsonschema.validate(body, RAY_DETAILS_SCHEMA)
    assert body["controller_info"] == {
        "node_id": "node-1",
        "node_ip": "10.0.0.1",
        "node_instance_id": "node-1",
        "actor_id": "controller-7",
        "actor_name": "SERVE_CONTROLLER_ACTOR",
        "worker_id": "7",
        "log_file_path": "/var/log/controller.log",
    }
    assert body["proxies"]["node-1"]["actor_name"] == "SERVE_PROXY_ACTOR-node-1"
    assert body["proxies"]["node-1"]["status"] == "HEALTHY"
    greeter = body["applications"]["composed"]["deployments"]["Greeter"]
    assert greeter["replicas"][0]["actor_name"] == "SERVE_REPLICA::composed#Greeter#r1"
    assert greeter["replicas"][0]["pid"] == 4242
    assert greeter["required_resources"] == {"CPU": 0.5}
    assert greeter["deployment_config"]["user_config"] == {"greeting": "Hi"}


#: The keys of Ray 2.60's answer at each level (capture_details_keys.py, run with Ray 2.60)
RAY_KEYS: dict[str, list[str]] = json.loads((REFERENCE / "details-keys.json").read_text())


def test_every_key_of_rays_answer_is_there_at_every_level() -> None:
    dead = ReplicaProcessView(node_process("r0"), "r0", "STOPPED", 4241, 1699999999.0)
    view = composed_view()
    app = view.applications[0]
    greeter = dataclasses.replace(app.deployments[1], recent_dead_replicas=[dead])
    view = dataclasses.replace(
        view,
        applications=[dataclasses.replace(app, deployments=[app.deployments[0], greeter])],
        health=ControllerHealth(1700000001.0, 1700000000.0, 12, 80.5),
    )
    body = details_body(instance_details(view))
    application = body["applications"]["composed"]
    deployment = application["deployments"]["Greeter"]
    (group,) = body["target_groups"]
    found = {
        "instance": body,
        "application": application,
        "deployment": deployment,
        "deployment_config": deployment["deployment_config"],
        "replica": deployment["replicas"][0],
        "proxy": body["proxies"]["node-1"],
        "target_group": group,
        "target": group["targets"][0],
    }
    for level, keys in RAY_KEYS.items():
        assert set(keys) <= set(found[level]), (level, set(keys) - set(found[level]))
    assert set(RAY_KEYS["replica"]) <= set(deployment["recent_dead_replicas"][0])
    jsonschema.validate(body, RAY_DETAILS_SCHEMA)


def test_the_filled_keys_say_what_kubeserve_does() -> None:
    view = dataclasses.replace(composed_view(), rollout=SIDE_BY_SIDE)
    body = details_body(instance_details(view))
    assert body["restores_unset_config_options"] is True
    assert body["target_groups"] == [
        {
            "targets": [
                {
                    "ip": "10.0.0.1",
                    "port": 8000,
                    "instance_id": "node-1",
                    "name": "SERVE_PROXY_ACTOR-node-1",
                }
            ],
            "route_prefix": "/",
            "protocol": "HTTP",
            "app_name": "",
            "ingress_request_router_targets": [],
            "ingress_deployment_name": "",
        }
    ]
    assert "controller_health_metrics" not in body  # nothing measured: nothing said
    config = body["applications"]["composed"]["deployments"]["Greeter"]["deployment_config"]
    assert (config["rolling_update_percentage"], config["max_surge_percent"]) == (1.0, 100)
    assert config["backpressure_config"]["status_code"] == 503
    assert config["request_router_config"]["request_router_class"].endswith(
        "PowerOfTwoChoicesRequestRouter"
    )
    assert body["applications"]["composed"]["deployments"]["Greeter"]["recent_dead_replicas"] == []
    unhealthy = dataclasses.replace(
        view, proxies={"node-1": ProxyView(node_process("p1"), "DRAINING")}
    )
    assert details_body(instance_details(unhealthy))["target_groups"][0]["targets"] == []


def test_a_deployment_not_reported_yet_is_updating() -> None:
    body = details_body(instance_details(composed_view()))
    frontend = body["applications"]["composed"]["deployments"]["Frontend"]
    assert (frontend["status"], frontend["status_trigger"], frontend["message"]) == (
        "UPDATING",
        "CONFIG_UPDATE_STARTED",
        "",
    )
    assert frontend["replicas"] == []


def test_the_topology_says_who_calls_whom() -> None:
    app = details_body(instance_details(composed_view()))["applications"]["composed"]
    topology = app["deployment_topology"]
    assert topology["ingress_deployment"] == "Frontend"
    assert topology["nodes"]["Frontend"]["outbound_deployments"] == [
        {"name": "Greeter", "app_name": "composed"}
    ]
    assert topology["nodes"]["Frontend"]["is_ingress"] is True
    assert topology["nodes"]["Greeter"]["is_ingress"] is False


def test_unknown_graph_and_invalid_config_are_left_out_not_null() -> None:
    view = composed_view(config=None, graph=None, deployments=[], status="DEPLOY_FAILED")
    app = details_body(instance_details(view))["applications"]["composed"]
    assert "deployment_topology" not in app
    assert "deployed_app_config" not in app
    assert app["deployments"] == {}


def test_single_application_status_lists_every_deployment() -> None:
    details = instance_details(composed_view(status="RUNNING", message="ok"))
    status = single_app_status("composed", details.applications["composed"])
    assert status.model_dump(mode="json") == {
        "name": "composed",
        "app_status": {"status": "RUNNING", "message": "ok", "deployment_timestamp": 1700000000.5},
        "deployment_statuses": [
            {"name": "Frontend", "status": "UPDATING", "message": ""},
            {"name": "Greeter", "status": "HEALTHY", "message": ""},
        ],
    }


def test_an_application_that_does_not_run_is_not_started() -> None:
    status = single_app_status("", None).model_dump(mode="json")
    assert status["app_status"]["status"] == "NOT_STARTED"
    assert status["deployment_statuses"] == []


def test_the_json_body_is_the_models_dump_and_follows_every_change() -> None:
    """An application that did not change is answered from what the previous GET built (the
    same model, not validated again); one that changed is built anew."""
    view = composed_view()
    first = instance_details(view)
    assert json.loads(details_json(first)) == details_body(first)
    again = instance_details(composed_view())  # equal views, new objects
    assert again.applications["composed"] is first.applications["composed"]
    assert json.loads(details_json(again)) == details_body(first)
    changed = instance_details(composed_view(status="RUNNING", message="all good"))
    assert changed.applications["composed"] is not first.applications["composed"]
    body = json.loads(details_json(changed))
    assert body == details_body(changed)
    assert (
        body["applications"]["composed"]["status"],
        body["applications"]["composed"]["message"],
    ) == ("RUNNING", "all good")
    empty = instance_details(None)
    assert json.loads(details_json(empty)) == details_body(empty)
