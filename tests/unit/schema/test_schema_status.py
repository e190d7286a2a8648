"""Response bodies: what the Ray 2.60 client parses must be exactly what Ray 2.60 publishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from kubeserve.schema import (
    APIType,
    ApplicationDetails,
    ApplicationStatus,
    ApplicationStatusInfo,
    DeploymentDetails,
    DeploymentSchema,
    DeploymentStatus,
    DeploymentStatusInfo,
    DeploymentStatusTrigger,
    ProxyDetails,
    ProxyStatus,
    ReplicaDetails,
    ReplicaState,
    ReportedDeploymentConfig,
    ServeActorDetails,
    ServeDeploySchema,
    ServeInstanceDetails,
    ServeStatusSchema,
    empty_instance_details,
    parse_body,
)

REFERENCE = Path(__file__).resolve().parents[2] / "reference" / "ray-2.60"
RAY_DETAILS_SCHEMA = json.loads((REFERENCE / "ServeInstanceDetails.json").read_text())


def representative_details() -> ServeInstanceDetails:
    """A running instance with one application of two deployments, as the controller builds it."""
    config = parse_body(
        ServeDeploySchema,
        {
            "applications": [
                {
                    "name": "app1",
                    "route_prefix": "/app1",
                    "import_path": "golden_app:app",
                    "runtime_env": {"env_vars": {"A": "1"}},
                    "deployments": [
                        {"name": "Greeter", "cluster_actor_options": {"num_cpus": 1}},
                        {"name": "Model", "max_concurrent_queries": 3},
                    ],
                }
            ]
        },
    )
    effective = ReportedDeploymentConfig(
        name="Greeter",
        num_replicas=2,
        max_ongoing_requests=5,
        user_config=None,
        graceful_shutdown_wait_loop_s=2,
        graceful_shutdown_timeout_s=20,
        health_check_period_s=10,
        health_check_timeout_s=30,
        ray_actor_options=parse_body(
            DeploymentSchema, {"name": "x", "ray_actor_options": {"num_cpus": 1}}
        ).ray_actor_options,
    )
    replica = ReplicaDetails(
        node_id="n1",
        node_ip="127.0.0.1",
        actor_id="a1",
        actor_name="SERVE_REPLICA::app1#Greeter#r1",
        worker_id="w1",
        log_file_path="/tmp/replica.log",
        replica_id="r1",
        state=ReplicaState.RUNNING,
        pid=1234,
        start_time_s=1700000000.5,
    )
    greeter = DeploymentDetails(
        name="Greeter",
        status=DeploymentStatus.HEALTHY,
        status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_COMPLETED,
        message="",
        deployment_config=effective,
        target_num_replicas=2,
        required_resources={"CPU": 1},
        replicas=[replica, replica.model_copy(update={"replica_id": "r2"})],
    )
    model = DeploymentDetails(
        name="Model",
        status=DeploymentStatus.UPDATING,
        status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_STARTED,
        message="starting 1 replica",
        deployment_config=ReportedDeploymentConfig(
            name="Model", num_replicas=1, max_ongoing_requests=3
        ),
        target_num_replicas=1,
        required_resources={"CPU": 1},
        replicas=[],
    )
    app = ApplicationDetails(
        name="app1",
        route_prefix="/app1",
        docs_path=None,
        status=ApplicationStatus.DEPLOYING,
        message="",
        last_deployed_time_s=1700000000.0,
        deployed_app_config=config.applications[0],
        source=APIType.DECLARATIVE,
        deployments={"Greeter": greeter, "Model": model},
        external_scaler_enabled=False,
    )
    return ServeInstanceDetails(
        controller_info=ServeActorDetails(node_id="n1", node_ip="127.0.0.1", actor_id="c1"),
        proxy_location=config.proxy_location,
        http_options=config.http_options,
        grpc_options=config.grpc_options,
        proxies={"n1": ProxyDetails(node_id="n1", node_ip="127.0.0.1", status=ProxyStatus.HEALTHY)},
        applications={"app1": app},
        target_capacity=None,
    )


def test_dumped_details_validate_against_rays_published_schema() -> None:
    body = representative_details().model_dump(mode="json")
    jsonschema.validate(body, RAY_DETAILS_SCHEMA)


def test_deployed_app_config_shows_only_the_given_overrides() -> None:
    body = representative_details().model_dump(mode="json")
    assert body["applications"]["app1"]["deployed_app_config"] == {
        "name": "app1",
        "route_prefix": "/app1",
        "import_path": "golden_app:app",
        "runtime_env": {"env_vars": {"A": "1"}},
        "deployments": [
            {"name": "Greeter", "ray_actor_options": {"num_cpus": 1.0}},
            {"name": "Model", "max_ongoing_requests": 3},
        ],
    }


def test_deployment_config_carries_no_nulls_for_unset_fields() -> None:
    config = representative_details().model_dump(mode="json")["applications"]["app1"]
    model_config = config["deployments"]["Model"]["deployment_config"]
    assert model_config == {"name": "Model", "num_replicas": 1, "max_ongoing_requests": 3}


def test_details_round_trip_through_our_models() -> None:
    body = representative_details().model_dump(mode="json")
    assert ServeInstanceDetails.model_validate(body).model_dump(mode="json") == body


def test_minimal_body_accepted_by_the_serve_cli_parses() -> None:
    body = json.loads((REFERENCE / "minimal-details-accepted-by-serve-cli.json").read_text())
    details = ServeInstanceDetails.model_validate(body)
    assert (
        details.applications["app1"].deployments["Greeter"].replicas[0].state
        is ReplicaState.RUNNING
    )
    jsonschema.validate(details.model_dump(mode="json"), RAY_DETAILS_SCHEMA)


def test_empty_instance_details_is_what_ray_sends() -> None:
    body = empty_instance_details().model_dump(mode="json", exclude_unset=True)
    assert body == {
        "controller_info": {},
        "proxies": {},
        "applications": {},
        "target_capacity": None,
    }
    jsonschema.validate(body, RAY_DETAILS_SCHEMA)
    assert ServeInstanceDetails.model_validate(body).controller_info.node_id is None


@pytest.mark.parametrize(
    "where",
    ["top", "application", "deployment"],
)
def test_extra_keys_are_rejected_where_the_ray_client_rejects_them(where: str) -> None:
    body: dict[str, Any] = representative_details().model_dump(mode="json")
    target = {
        "top": body,
        "application": body["applications"]["app1"],
        "deployment": body["applications"]["app1"]["deployments"]["Greeter"],
    }[where]
    target["surprise"] = 1
    with pytest.raises(ValidationError):
        ServeInstanceDetails.model_validate(body)


@pytest.mark.parametrize(
    ("enum", "definition"),
    [
        (ApplicationStatus, "ApplicationStatus"),
        (DeploymentStatus, "DeploymentStatus"),
        (DeploymentStatusTrigger, "DeploymentStatusTrigger"),
        (ReplicaState, "ReplicaState"),
        (ProxyStatus, "ProxyStatus"),
        (APIType, "APIType"),
    ],
)
def test_enums_hold_exactly_rays_values(enum: type[Any], definition: str) -> None:
    assert [m.value for m in enum] == RAY_DETAILS_SCHEMA["$defs"][definition]["enum"]


def test_unknown_status_value_is_rejected() -> None:
    with pytest.raises(ValidationError):
        ApplicationStatusInfo.model_validate({"status": "SLEEPING"})


def test_response_models_have_rays_field_sets() -> None:
    defs = RAY_DETAILS_SCHEMA["$defs"]
    for model, name in [
        (ApplicationDetails, "ApplicationDetails"),
        (DeploymentDetails, "DeploymentDetails"),
        (ReplicaDetails, "ReplicaDetails"),
        (ProxyDetails, "ProxyDetails"),
        (ServeActorDetails, "ServeActorDetails"),
    ]:
        assert set(model.model_fields) == set(defs[name]["properties"]), name
        required = {n for n, f in model.model_fields.items() if f.is_required()}
        assert required == set(defs[name].get("required", [])), name
    assert set(ServeInstanceDetails.model_fields) == set(RAY_DETAILS_SCHEMA["properties"])


# ------------------------------------------------------------ GET /api/serve/deployments/status


def test_status_defaults() -> None:
    status = ServeStatusSchema(app_status=ApplicationStatusInfo(status=ApplicationStatus.RUNNING))
    assert status.model_dump(mode="json") == {
        "name": "",
        "app_status": {"status": "RUNNING", "message": "", "deployment_timestamp": 0},
        "deployment_statuses": [],
    }


def test_status_round_trip_and_strictness() -> None:
    body = {
        "name": "app",
        "app_status": {"status": "DEPLOY_FAILED", "message": "boom", "deployment_timestamp": 1.5},
        "deployment_statuses": [{"name": "D", "status": "UNHEALTHY", "message": "no health"}],
    }
    status = ServeStatusSchema.model_validate(body)
    assert status.deployment_statuses == [
        DeploymentStatusInfo(name="D", status=DeploymentStatus.UNHEALTHY, message="no health")
    ]
    assert status.model_dump(mode="json") == body
    with pytest.raises(ValidationError):
        ServeStatusSchema.model_validate({**body, "extra": 1})
    with pytest.raises(ValidationError):
        ServeStatusSchema.model_validate({"name": "app"})
