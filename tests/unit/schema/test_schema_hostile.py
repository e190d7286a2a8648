"""Hostile and mistaken bodies: every one is a SchemaError (HTTP 400) naming the offending path."""

from __future__ import annotations

from typing import Any

import pytest

from kubeserve.schema import (
    SchemaError,
    ServeApplicationSchema,
    ServeDeploySchema,
    decode_json_body,
    parse_body,
)
from kubeserve.schema.limits import (
    MAX_APPLICATIONS,
    MAX_DEPLOYMENTS_PER_APPLICATION,
    MAX_JSON_DEPTH,
    MAX_REPLICAS_PER_DEPLOYMENT,
)

DEP = ["applications", 0, "deployments", 0]


def problem(raw: bytes) -> tuple[list[str | int], str]:
    with pytest.raises(SchemaError) as info:
        decode_json_body(raw)
    (detail,) = info.value.details
    return detail["loc"], detail["msg"]


def locs(body: Any) -> list[list[str | int]]:
    with pytest.raises(SchemaError) as info:
        parse_body(ServeDeploySchema, body)
    return [d["loc"] for d in info.value.details]


def app(**fields: Any) -> dict[str, Any]:
    return {"applications": [{"name": "a", "import_path": "m:app", **fields}]}


def deployment(**fields: Any) -> dict[str, Any]:
    return app(deployments=[{"name": "d", **fields}])


# --------------------------------------------------------------------------- raw JSON


def test_100k_nested_arrays_are_refused_at_the_depth_limit() -> None:
    loc, msg = problem(b"[" * 100_000 + b"]" * 100_000)
    assert loc == [0] * MAX_JSON_DEPTH
    assert f"deeper than {MAX_JSON_DEPTH}" in msg


def test_deep_user_config_is_refused_at_its_path() -> None:
    raw = b'{"applications": [{"deployments": [{"user_config": ' + b'{"k": ' * 260
    raw += b"1" + b"}" * 260 + b"}]}]}"
    loc, msg = problem(raw)
    assert loc[:5] == [*DEP, "user_config"]
    assert "nested deeper" in msg


def test_depth_limit_is_inclusive() -> None:
    at_limit = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json_body(at_limit) is not None
    assert problem(b"[" + at_limit + b"]")[0] == [0] * MAX_JSON_DEPTH


def test_5000_digit_integer_is_refused_at_its_path() -> None:
    loc, msg = problem(
        b'{"applications": [{"deployments": [{"num_replicas": ' + b"9" * 5000 + b"}]}]}"
    )
    assert loc == [*DEP, "num_replicas"]
    assert "5000 digits" in msg and "64 bits" in msg


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b'{"x": [1, 9223372036854775808]}', ["x", 1]),
        (b'{"x": -9223372036854775809}', ["x"]),
        (b'{"x": {"y": NaN}}', ["x", "y"]),
        (b'{"x": [Infinity]}', ["x", 0]),
        (b'{"x": 1e400}', ["x"]),
    ],
)
def test_numbers_no_json_reader_reads_back_are_refused(raw: bytes, loc: list[Any]) -> None:
    assert problem(raw)[0] == loc


def test_64_bit_integers_and_ordinary_values_pass() -> None:
    body = (
        b'{"a": 9223372036854775807, "b": -9223372036854775808, "c": [1.5, true, null, "\xc3\xa9"]}'
    )
    assert decode_json_body(body)["a"] == 2**63 - 1


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b'{"applications": [{"name": "a\\ud800b"}]}', ["applications", 0, "name"]),
        (b'{"x": {"a\\udfffb": 1}}', ["x", "a\\udfffb"]),
        (b'"\\ud800"', []),
    ],
)
def test_lone_surrogates_are_refused_anywhere(raw: bytes, loc: list[Any]) -> None:
    where, msg = problem(raw)
    assert where == loc
    assert "surrogate" in msg


def test_surrogate_pairs_are_text() -> None:
    assert decode_json_body(b'{"x": "\\ud83d\\ude00"}') == {"x": "\N{GRINNING FACE}"}


def test_not_utf8_and_malformed_json_are_refused_at_the_body() -> None:
    assert problem(b'{"x": "\xff"}') == ([], "body is not UTF-8 text: invalid byte at offset 7")
    loc, msg = problem(b'{"x": ')
    assert loc == [] and msg.startswith("malformed JSON")


def test_parse_body_decodes_raw_bodies_with_the_same_rules() -> None:
    with pytest.raises(SchemaError) as info:
        parse_body(ServeDeploySchema, b'{"applications": [{"name": "a\\ud800"}]}')
    assert info.value.details[0]["loc"] == ["applications", 0, "name"]


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name", ["default", "app1", "my_app", "text-ml.v2", "My App", "_private", "A" * 100]
)
def test_names_ray_users_write_are_accepted(name: str) -> None:
    parse_body(ServeDeploySchema, app(name=name, deployments=[{"name": name}]))


@pytest.mark.parametrize(
    "name",
    [
        "a\u0000b",
        "../../../../tmp/x",
        "a/b",
        "a\\b",
        "..",
        ".hidden",
        "a..b",
        "-rf",
        "tab\there",
        "new\nline",
        " padded ",
        "caf\u00e9",
        "A" * 101,
    ],
)
def test_unsafe_names_are_refused_naming_the_field(name: str) -> None:
    assert locs(app(name=name)) == [["applications", 0, "name"]]
    assert locs(deployment(name=name)) == [[*DEP, "name"]]


def test_single_application_default_name_stays_valid() -> None:
    assert parse_body(ServeApplicationSchema, {"import_path": "m:app"}).name == ""


# --------------------------------------------------------------------------- capacity


def test_num_replicas_over_the_cap_is_refused() -> None:
    parse_body(ServeDeploySchema, deployment(num_replicas=MAX_REPLICAS_PER_DEPLOYMENT))
    with pytest.raises(SchemaError) as info:
        parse_body(ServeDeploySchema, deployment(num_replicas=1_000_000))
    (detail,) = info.value.details
    assert detail["loc"] == [*DEP, "num_replicas"]
    assert "limit of 1000 replicas" in detail["msg"]


@pytest.mark.parametrize("field", ["min_replicas", "initial_replicas", "max_replicas"])
def test_autoscaling_replica_bounds_are_capped(field: str) -> None:
    config = {"min_replicas": 0, "max_replicas": MAX_REPLICAS_PER_DEPLOYMENT, field: 1001}
    assert [*DEP, "autoscaling_config", field] in locs(deployment(autoscaling_config=config))


def test_number_of_applications_and_deployments_is_capped() -> None:
    apps = [
        {"name": f"a{i}", "import_path": "m:app", "route_prefix": None}
        for i in range(MAX_APPLICATIONS + 1)
    ]
    assert locs({"applications": apps}) == [["applications"]]
    deps = [{"name": f"d{i}"} for i in range(MAX_DEPLOYMENTS_PER_APPLICATION + 1)]
    assert locs(app(deployments=deps)) == [["applications", 0, "deployments"]]


# --------------------------------------------------------------------------- routes, periods


@pytest.mark.parametrize(
    "prefix", ["/", "/a", "/a/b", "/v1:predict", "/caf%C3%A9", "/a%20b", "/-a", "/%25"]
)
def test_route_prefixes_requests_can_reach_are_accepted(prefix: str) -> None:
    parse_body(ServeDeploySchema, app(route_prefix=prefix))


@pytest.mark.parametrize(
    ("prefix", "says"),
    [
        ("//a", "write '/a'"),
        ("/./a", "write '/a'"),
        ("/a/../b", "write '/b'"),
        ("/%61", "'a'"),
        ("/%2Fa", "encoded '/'"),
        ("/caf%c3%a9", "'%C3'"),
        ("/a b", "' '"),
        ("/a?x", "'?'"),
        ("/a#x", "'#'"),
        ("/a\u0000", "'\\x00'"),
        ("/a\u0007", "'\\x07'"),
        ("/caf\u00e9", "'é'"),
        ("/a%zz", "two hex digits"),
        ("/-", "reserved"),
        ("/-/routes", "reserved"),
    ],
)
def test_route_prefixes_the_proxy_never_matches_are_refused(prefix: str, says: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse_body(ServeDeploySchema, app(route_prefix=prefix))
    (detail,) = info.value.details
    assert detail["loc"] == ["applications", 0, "route_prefix"]
    assert says in detail["msg"]


def test_prefixes_that_route_alike_are_one_prefix() -> None:
    # /a/ and //a are refused on their own, so the remaining spellings of /a are exactly "/a".
    body = {
        "applications": [
            {"name": "x", "import_path": "m:app", "route_prefix": "/a"},
            {"name": "y", "import_path": "m:app", "route_prefix": "/a"},
        ]
    }
    assert locs(body) == [["applications", 1, "route_prefix"]]
    for alias in ("/a/", "//a", "/./a", "/%61"):
        assert locs(app(route_prefix=alias)) == [["applications", 0, "route_prefix"]]


@pytest.mark.parametrize(
    "field", ["health_check_period_s", "health_check_timeout_s", "graceful_shutdown_wait_loop_s"]
)
def test_loop_periods_have_a_floor(field: str) -> None:
    parse_body(ServeDeploySchema, deployment(**{field: 0.1}))
    assert locs(deployment(**{field: 0.001})) == [[*DEP, field]]


@pytest.mark.parametrize("env", [{"A\u0000": "1"}, {"A=B": "1"}, {"": "1"}, {"A": "x\u0000"}])
def test_env_vars_a_process_cannot_receive_are_refused(env: dict[str, str]) -> None:
    errors = locs(app(runtime_env={"env_vars": env}))
    assert len(errors) == 1
    assert errors[0][:4] == ["applications", 0, "runtime_env", "env_vars"]
