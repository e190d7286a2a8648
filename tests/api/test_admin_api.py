"""The admin API over HTTP against a running ``kubeserve start``: validation, errors, families."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from kubeserve.schema.status import ServeInstanceDetails
from support.common import http, wait_for
from support.kubeserve_start import Kubeserve

RAY_REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "ray-2.60"

HELLO = {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"}


def test_ray_version_endpoint(kubeserve: Kubeserve) -> None:
    status, body = http("GET", f"{kubeserve.api}/api/ray/version")
    assert status == 200
    assert body["ray_version"] == "2.60.0"


def test_nothing_running_answers_like_ray(kubeserve: Kubeserve) -> None:
    assert kubeserve.details() == {
        "controller_info": {},
        "proxies": {},
        "applications": {},
        "target_capacity": None,
    }
    assert http("DELETE", f"{kubeserve.api}/api/serve/applications/")[0] == 200


def test_schema_violation_is_400_with_the_field_path(kubeserve: Kubeserve) -> None:
    config = kubeserve.config([{**HELLO, "deployments": [{"name": "Hello", "num_replicas": 0}]}])
    status, body = http("PUT", f"{kubeserve.api}/api/serve/applications/", config)
    assert status == 400
    assert ["applications", 0, "deployments", 0, "num_replicas"] in [
        d["loc"] for d in body["details"]
    ]
    assert body["error"]


def test_unsupported_fields_are_400s_saying_why_in_both_families(kubeserve: Kubeserve) -> None:
    tls = {"ssl_keyfile": "/k.pem", "ssl_certfile": "/c.pem"}
    config = {**kubeserve.config([HELLO]), "http_options": tls}
    status, body = http("PUT", f"{kubeserve.api}/api/serve/applications/", config)
    assert status == 400
    assert ["http_options", "ssl_certfile"] in [d["loc"] for d in body["details"]]
    assert "/c.pem' cannot be read" in body["error"]  # checked before it is stored
    # image_uri is the replica image on Kubernetes; the local backend runs processes.
    deployments = [{"name": "Hello", "ray_actor_options": {"runtime_env": {"image_uri": "x"}}}]
    config = kubeserve.config([{**HELLO, "deployments": deployments}])
    status, body = http("PUT", f"{kubeserve.api}/api/serve/applications/", config)
    assert status == 400
    loc = ["applications", 0, "deployments", 0, "ray_actor_options", "runtime_env", "image_uri"]
    assert [d["loc"] for d in body["details"]] == [loc]
    single = {"import_path": HELLO["import_path"], "runtime_env": {"image_uri": "x"}}
    status, body = http("PUT", f"{kubeserve.api}/api/serve/deployments/", single)
    assert status == 400
    assert [d["loc"] for d in body["details"]] == [["runtime_env", "image_uri"]]
    assert "local processes" in body["details"][0]["msg"]


def test_unknown_field_is_400_naming_it(kubeserve: Kubeserve) -> None:
    config = kubeserve.config([{**HELLO, "improt_path": "x:y"}])
    status, body = http("PUT", f"{kubeserve.api}/api/serve/applications/", config)
    assert status == 400
    assert ["applications", 0, "improt_path"] in [d["loc"] for d in body["details"]]


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "says"),
    [
        pytest.param(b'{"applications": [', "application/json", 400, "malformed JSON", id="json"),
        pytest.param(
            b"applications=[]",
            "application/x-www-form-urlencoded",
            415,
            "application/json",
            id="content-type",
        ),
        pytest.param(
            b'{"applications": [], "pad": "' + b"x" * (9 * 1024 * 1024) + b'"}',
            "application/json",
            413,
            "too large",
            id="size",
        ),
    ],
)
def test_a_bad_body_is_a_4xx_saying_why(
    kubeserve: Kubeserve, raw: bytes, content_type: str, status: int, says: str
) -> None:
    """Malformed JSON is a 400, another content type a 415, a body over the limit a 413: never
    a 500, and the error says which."""
    answer, body = http(
        "PUT",
        f"{kubeserve.api}/api/serve/applications/",
        raw=raw,
        headers={"Content-Type": content_type},
    )
    assert answer == status
    assert says in body["error"]


def test_unknown_endpoint_is_a_json_404(kubeserve: Kubeserve) -> None:
    status, body = http("GET", f"{kubeserve.api}/api/serve/nothing")
    assert status == 404
    assert "no such endpoint" in body["error"]


def test_bad_put_loses_nothing_and_host_port_change_is_409(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([HELLO])[0] == 200
    ks.wait_app("hello")
    bad = ks.config([{**HELLO, "route_prefix": "no-slash"}])
    assert http("PUT", f"{ks.api}/api/serve/applications/", bad)[0] == 400
    moved = ks.config([HELLO])
    moved["http_options"]["port"] = ks.proxy_port + 1
    status, body = http("PUT", f"{ks.api}/api/serve/applications/", moved)
    assert status == 409
    assert "DELETE" in body["error"] and "port" in body["error"]
    assert ks.app("hello")["status"] == "RUNNING"  # type: ignore[index]
    assert http("GET", f"{ks.proxy}/hello")[1] == "hello, world\n"


def test_put_removes_applications_it_does_not_list(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    probe = {"name": "probe", "route_prefix": "/probe", "import_path": "e2e_probe:app"}
    ks.put([HELLO, probe])
    ks.wait_app("hello")
    ks.wait_app("probe")
    ks.put([HELLO])
    wait_for(lambda: set(ks.details()["applications"]) == {"hello"}, 60, what="probe removed")
    assert http("GET", f"{ks.proxy}/probe")[0] == 404  # /probe now falls under no route
    assert http("GET", f"{ks.proxy}/hello")[0] == 200


def test_deployed_app_config_holds_only_the_given_fields(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    app = {**HELLO, "deployments": [{"name": "Hello", "max_concurrent_queries": 7}]}
    ks.put([app])
    details = ks.wait_app("hello")
    assert details["deployed_app_config"] == {
        **HELLO,
        "deployments": [{"name": "Hello", "max_ongoing_requests": 7}],
    }
    config = details["deployments"]["Hello"]["deployment_config"]
    assert config["max_ongoing_requests"] == 7
    assert config["num_replicas"] == 1
    assert config["health_check_period_s"] == 10


def test_single_application_family(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    base = f"{ks.api}/api/serve/deployments/"
    body = {"import_path": "examples.hello:app", "host": "127.0.0.1", "port": ks.proxy_port}
    status, _ = http("PUT", base, body)
    assert status == 200
    assert http("GET", base) == (200, body)

    def running() -> dict[str, object] | None:
        status = http("GET", f"{base}status")[1]
        return status if status["app_status"]["status"] == "RUNNING" else None

    status_body = wait_for(running, 60, what="single app RUNNING")
    assert status_body["name"] == ""
    assert status_body["deployment_statuses"] == [
        {"name": "Hello", "status": "HEALTHY", "message": ""}
    ]
    assert status_body["app_status"]["deployment_timestamp"] > 0
    assert http("GET", f"{ks.proxy}/")[1] == "hello, world\n"
    assert http("DELETE", base)[0] == 200
    wait_for(lambda: not ks.details()["applications"], 60, what="shutdown")


def test_status_when_nothing_runs_starts_the_serving_layer(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    status, body = http("GET", f"{ks.api}/api/serve/deployments/status")
    assert status == 200
    assert body["app_status"]["status"] == "NOT_STARTED"
    assert body["deployment_statuses"] == []
    assert ks.details()["controller_info"]["node_id"]


def test_instance_details_match_ray_2_60s_published_schema(clean_kubeserve: Kubeserve) -> None:
    """The GET body the Ray client parses strictly: Ray's JSON schema and our response model."""
    ks = clean_kubeserve
    composed = {
        "name": "composed",
        "route_prefix": "/",
        "import_path": "examples.composed:app",
        "deployments": [{"name": "Greeter", "num_replicas": 2, "user_config": {"greeting": "Hi"}}],
    }
    ks.put([HELLO, composed])
    ks.wait_app("hello")
    ks.wait_app("composed")
    ks.wait_proxy()
    body = ks.details()
    schema = json.loads((RAY_REFERENCE / "ServeInstanceDetails.json").read_text())
    jsonschema.validate(body, schema)
    parsed = ServeInstanceDetails.model_validate(body)
    # Every key of Ray 2.60's answer, at every level (capture_details_keys.py)
    ray_keys = json.loads((RAY_REFERENCE / "details-keys.json").read_text())
    deployment = body["applications"]["composed"]["deployments"]["Greeter"]
    (group,) = body["target_groups"]
    found = {
        "instance": body,
        "application": body["applications"]["composed"],
        "deployment": deployment,
        "deployment_config": deployment["deployment_config"],
        "replica": deployment["replicas"][0],
        "proxy": next(iter(body["proxies"].values())),
        "target_group": group,
        "target": group["targets"][0],
    }
    for level, keys in ray_keys.items():
        assert set(keys) <= set(found[level]), (level, set(keys) - set(found[level]))
    assert group["targets"][0]["port"] == body["http_options"]["port"]
    assert body["controller_health_metrics"]["process_memory_mb"] > 0
    greeter = parsed.applications["composed"].deployments["Greeter"]
    assert greeter.target_num_replicas == 2
    assert len(greeter.replicas) == 2
    assert all(r.state == "RUNNING" and r.pid for r in greeter.replicas)
    assert body["applications"]["composed"]["deployment_topology"]["ingress_deployment"] == (
        "Frontend"
    )
