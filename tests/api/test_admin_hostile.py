"""Hostile and mistaken bodies over real HTTP: each is a JSON 400 naming the field, nothing is
stored, and the instance keeps serving (what used to be 500s, hot loops and bricked restarts)."""

from __future__ import annotations

from typing import Any

import pytest

from support.common import http
from support.kubeserve_start import Kubeserve

APPS = "/api/serve/applications/"


def put_raw(ks: Kubeserve, raw: bytes, path: str = APPS) -> tuple[int, Any]:
    return http("PUT", f"{ks.api}{path}", raw=raw, headers={"Content-Type": "application/json"})


def app_body(**fields: Any) -> dict[str, Any]:
    return {"name": "x", "route_prefix": "/x", "import_path": "examples.hello:app", **fields}


def assert_nothing_stored(ks: Kubeserve) -> None:
    assert ks.details()["applications"] == {}


@pytest.mark.parametrize(
    ("raw", "loc_start"),
    [
        (b"[" * 100_000 + b"]" * 100_000, [0, 0, 0]),
        (
            b'{"applications": [{"name": "x", "import_path": "a:b", "deployments": [{"name": "d",'
            b' "user_config": ' + b'{"k": ' * 260 + b"1" + b"}" * 260 + b"}]}]}",
            ["applications", 0, "deployments", 0, "user_config", "k"],
        ),
        (
            b'{"applications": [{"name": "x", "import_path": "a:b", "deployments": [{"name": "d",'
            b' "num_replicas": ' + b"7" * 5000 + b"}]}]}",
            ["applications", 0, "deployments", 0, "num_replicas"],
        ),
        (
            b'{"applications": [{"name": "a\\ud800b", "import_path": "a:b"}]}',
            ["applications", 0, "name"],
        ),
        (b'{"applications": [], "x": {"k\\udc00": 1}}', ["x", "k\\udc00"]),
        (b'{"applications": [NaN]}', ["applications", 0]),
    ],
    ids=[
        "100k-deep",
        "user_config-260-deep",
        "5000-digits",
        "surrogate-name",
        "surrogate-key",
        "nan",
    ],
)
def test_hostile_json_is_a_400_at_its_path(
    kubeserve: Kubeserve, raw: bytes, loc_start: list[Any]
) -> None:
    status, body = put_raw(kubeserve, raw)
    assert status == 400, body
    assert body["details"][0]["loc"][: len(loc_start)] == loc_start
    assert "Traceback" not in str(body)
    assert_nothing_stored(kubeserve)


def test_hostile_json_on_the_single_application_family_too(kubeserve: Kubeserve) -> None:
    status, body = put_raw(
        kubeserve, b'{"import_path": "a:b", "name": "a\\ud800"}', "/api/serve/deployments/"
    )
    assert (status, body["details"][0]["loc"]) == (400, ["name"])


@pytest.mark.parametrize("name", ["a\u0000b", "../../../../tmp/x", "a/b", "..", "new\nline", "-rf"])
def test_unsafe_application_names_are_refused(kubeserve: Kubeserve, name: str) -> None:
    status, body = kubeserve.put([app_body(name=name)])
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 0, "name"]
    assert_nothing_stored(kubeserve)


def test_unsafe_deployment_names_are_refused(kubeserve: Kubeserve) -> None:
    status, body = kubeserve.put([app_body(deployments=[{"name": "../Hello"}])])
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 0, "deployments", 0, "name"]


def test_a_million_replicas_is_refused_and_the_instance_keeps_answering(
    kubeserve: Kubeserve,
) -> None:
    status, body = kubeserve.put([app_body(deployments=[{"name": "Hello", "num_replicas": 10**6}])])
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 0, "deployments", 0, "num_replicas"]
    assert "limit of 1000" in body["error"]
    assert_nothing_stored(kubeserve)
    assert http("GET", f"{kubeserve.api}/api/ray/version")[0] == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_replicas", 2000), ("max_replicas", 10**6), ("initial_replicas", 5000)],
)
def test_autoscaling_bounds_are_capped(kubeserve: Kubeserve, field: str, value: int) -> None:
    autoscaling = {"min_replicas": 0, "max_replicas": 1000, field: value}
    dep = {"name": "Hello", "autoscaling_config": autoscaling}
    status, body = kubeserve.put([app_body(deployments=[dep])])
    assert status == 400
    locs = [d["loc"] for d in body["details"]]
    assert ["applications", 0, "deployments", 0, "autoscaling_config", field] in locs


def test_too_many_applications_is_refused(kubeserve: Kubeserve) -> None:
    apps = [app_body(name=f"a{i}", route_prefix=f"/a{i}") for i in range(1001)]
    status, body = kubeserve.put(apps)
    assert status == 400
    assert body["details"][0]["loc"] == ["applications"]


@pytest.mark.parametrize(
    ("first", "second"), [("/a", "/a/"), ("/a", "//a"), ("/a", "/./a"), ("/a", "/%61")]
)
def test_route_prefixes_that_mean_the_same_route_are_refused(
    kubeserve: Kubeserve, first: str, second: str
) -> None:
    apps = [app_body(name="one", route_prefix=first), app_body(name="two", route_prefix=second)]
    status, body = kubeserve.put(apps)
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 1, "route_prefix"]


@pytest.mark.parametrize("prefix", ["/a b", "/a?b", "/a#b", "/a\u0000", "/caf\u00e9", "/-/routes"])
def test_route_prefixes_the_proxy_never_matches_are_refused(
    kubeserve: Kubeserve, prefix: str
) -> None:
    status, body = kubeserve.put([app_body(route_prefix=prefix)])
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 0, "route_prefix"]


@pytest.mark.parametrize(
    "field", ["health_check_period_s", "health_check_timeout_s", "graceful_shutdown_wait_loop_s"]
)
def test_loop_periods_below_the_floor_are_refused(kubeserve: Kubeserve, field: str) -> None:
    status, body = kubeserve.put([app_body(deployments=[{"name": "Hello", field: 0.001}])])
    assert status == 400
    assert body["details"][0]["loc"] == ["applications", 0, "deployments", 0, field]
