"""Request-body rules: each accepts a valid case and rejects an invalid one at its JSON path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kubeserve.schema import (
    DeploymentSchema,
    SchemaError,
    ServeApplicationSchema,
    ServeDeploySchema,
    parse_body,
)

RAY_SCHEMA = (
    Path(__file__).resolve().parents[2] / "reference" / "ray-2.60" / "ServeDeploySchema.json"
)


def errors_of(model: type[BaseModel], body: Any) -> list[tuple[list[str | int], str]]:
    with pytest.raises(SchemaError) as info:
        parse_body(model, body)
    return [(d["loc"], d["msg"]) for d in info.value.details]


def locs_of(model: type[BaseModel], body: Any) -> list[list[str | int]]:
    return [loc for loc, _ in errors_of(model, body)]


def multi(*deployments: dict[str, Any], **app: Any) -> dict[str, Any]:
    """A multi-application body with one application holding ``deployments``."""
    return {
        "applications": [{"import_path": "pkg.mod:app", **app, "deployments": list(deployments)}]
    }


DEP = ["applications", 0, "deployments", 0]


# --------------------------------------------------------------------------- unknown fields


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"applications": [], "extra": 1}, ["extra"]),
        ({"applications": [{"import_path": "a:b", "extra": 1}]}, ["applications", 0, "extra"]),
        (multi({"name": "d", "extra": 1}), [*DEP, "extra"]),
        (
            multi({"name": "d", "ray_actor_options": {"extra": 1}}),
            [*DEP, "ray_actor_options", "extra"],
        ),
        (
            multi({"name": "d", "autoscaling_config": {"extra": 1}}),
            [*DEP, "autoscaling_config", "extra"],
        ),
        ({"applications": [], "http_options": {"extra": 1}}, ["http_options", "extra"]),
        (multi(runtime_env={"extra": 1}), ["applications", 0, "runtime_env", "extra"]),
    ],
)
def test_unknown_fields_are_rejected_at_every_level(body: dict[str, Any], loc: list[Any]) -> None:
    assert errors_of(ServeDeploySchema, body) == [(loc, "unknown field: not allowed by the schema")]


def test_runtime_env_passes_known_ray_keys_through() -> None:
    env = {
        "excludes": ["*.pyc"],
        "env_vars": {"A": "1"},
        "config": {"setup_timeout_seconds": 9},
    }
    app = parse_body(ServeApplicationSchema, {"import_path": "a:b", "runtime_env": env})
    assert app.as_given()["runtime_env"] == env


@pytest.mark.parametrize("key", ["conda", "container", "py_executable"])
def test_runtime_env_interpreter_switches_are_refused_at_their_path(key: str) -> None:
    body = multi({"name": "d", "ray_actor_options": {"runtime_env": {key: ["requests"]}}})
    ((loc, message),) = errors_of(ServeDeploySchema, body)
    assert loc == [*DEP, "ray_actor_options", "runtime_env", key]
    assert message.startswith(f"{key} is not supported by kubeserve: switching interpreters")


@pytest.mark.parametrize(
    "runtime_env",
    [
        {"pip": ["requests==2.31", "-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/r.txt"]},
        {"pip": "requirements.txt"},
        {"pip": {"packages": ["a"], "pip_check": True, "pip_version": "==24.0"}},
        {"pip": {"packages": "requirements.txt", "pip_install_options": ["--no-deps"]}},
        {"uv": ["a", "a"]},
        {"uv": {"packages": ["a"], "uv_check": False, "uv_version": ">=0.5"}},
        {"uv": {"packages": ["a"], "uv_pip_install_options": ["--no-cache"]}},
    ],
)
def test_runtime_env_pip_and_uv_in_rays_shapes_are_accepted_as_given(
    runtime_env: dict[str, Any],
) -> None:
    app = parse_body(ServeApplicationSchema, {"import_path": "a:b", "runtime_env": runtime_env})
    assert app.as_given()["runtime_env"] == runtime_env


@pytest.mark.parametrize(
    ("runtime_env", "field", "message"),
    [
        ({"pip": {"packages": ["a"], "pip_chek": True}}, "pip", "can only have the fields"),
        ({"pip": {"pip_check": True}}, "pip", "must include the field 'packages'"),
        ({"pip": {"packages": ["a"], "pip_check": "yes"}}, "pip", "must be a boolean"),
        ({"pip": [1]}, "pip", "list of strings"),
        ({"uv": {"packages": "r.txt"}}, "uv", "list of strings"),
        ({"uv": {"packages": ["a"], "uv_version": 1}}, "uv", "must be a string"),
        ({"pip": ["a"], "uv": ["b"]}, "uv", "pip and uv exclude each other"),
    ],
)
def test_runtime_env_pip_and_uv_errors_name_the_field(
    runtime_env: dict[str, Any], field: str, message: str
) -> None:
    body = multi({"name": "d", "ray_actor_options": {"runtime_env": runtime_env}})
    errors = errors_of(ServeDeploySchema, body)
    assert any(
        loc == [*DEP, "ray_actor_options", "runtime_env", field] and message in msg
        for loc, msg in errors
    ), errors


# --------------------------------------------------------------------------- synonyms


@pytest.mark.parametrize("spelling", ["cluster_actor_options", "ray_actor_options"])
def test_actor_options_accept_either_spelling_and_dump_rays(spelling: str) -> None:
    dep = parse_body(DeploymentSchema, {"name": "d", spelling: {"num_cpus": 2}})
    assert dep.as_given() == {"name": "d", "ray_actor_options": {"num_cpus": 2.0}}


def test_actor_options_in_both_spellings_is_an_error() -> None:
    body = multi({"name": "d", "ray_actor_options": {}, "cluster_actor_options": {}})
    assert locs_of(ServeDeploySchema, body) == [[*DEP, "cluster_actor_options"]]


@pytest.mark.parametrize("spelling", ["max_concurrent_queries", "max_ongoing_requests"])
def test_max_ongoing_requests_accepts_either_spelling(spelling: str) -> None:
    dep = parse_body(DeploymentSchema, {"name": "d", spelling: 7})
    assert dep.as_given() == {"name": "d", "max_ongoing_requests": 7}


def test_max_ongoing_requests_in_both_spellings_is_an_error() -> None:
    body = multi({"name": "d", "max_concurrent_queries": 1, "max_ongoing_requests": 1})
    assert locs_of(ServeDeploySchema, body) == [[*DEP, "max_concurrent_queries"]]


def test_error_location_uses_the_spelling_the_client_sent() -> None:
    body = multi(
        {"name": "d", "max_concurrent_queries": 0, "cluster_actor_options": {"num_gpus": -1}}
    )
    assert sorted(map(str, locs_of(ServeDeploySchema, body))) == sorted(
        [
            str([*DEP, "max_concurrent_queries"]),
            str([*DEP, "cluster_actor_options", "num_gpus"]),
        ]
    )


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("num_replicas", 3, 0),
        ("num_replicas", "auto", "many"),
        ("num_replicas", None, -1),
        ("max_ongoing_requests", 1, 0),
        ("max_queued_requests", -1, 0),
        ("num_replicas", 1000, 1001),
        ("graceful_shutdown_wait_loop_s", 0.1, 0.05),
        ("graceful_shutdown_timeout_s", 0, -1),
        ("health_check_period_s", 0.1, 0.09),
        ("health_check_timeout_s", 1, 0),
        ("health_check_timeout_s", 0.1, 0.01),
        ("max_replicas_per_node", None, 101),
        ("rolling_update_percentage", None, 0),
        ("max_surge_percent", None, 101),
        ("is_driver_deployment", True, "perhaps"),
        ("user_config", {"a": 1}, [1]),
    ],
)
def test_deployment_field_rules(field: str, good: Any, bad: Any) -> None:
    parse_body(ServeDeploySchema, multi({"name": "d", field: good}))
    assert locs_of(ServeDeploySchema, multi({"name": "d", field: bad})) == [[*DEP, field]]


@pytest.mark.parametrize("field", ["num_cpus", "num_gpus", "memory", "object_store_memory"])
def test_actor_option_numbers_are_non_negative(field: str) -> None:
    parse_body(DeploymentSchema, {"name": "d", "cluster_actor_options": {field: 0}})
    body = {"name": "d", "cluster_actor_options": {field: -1}}
    assert locs_of(DeploymentSchema, body) == [["cluster_actor_options", field]]


def test_ray_260_actor_options_are_accepted() -> None:
    options = {"accelerator_type": "A100", "resources": {"custom": 1}, "label_selector": {}}
    dep = parse_body(DeploymentSchema, {"name": "d", "ray_actor_options": options})
    assert dep.as_given()["ray_actor_options"]["resources"] == {"custom": 1}


@pytest.mark.parametrize(
    ("field", "value"),
    [("fallback_strategy", [{"label_selector": {"z": "b"}}])],
)
def test_ray_260_scheduling_options_kubeserve_lacks_are_refused(field: str, value: Any) -> None:
    body = {"name": "d", "ray_actor_options": {field: value}}
    ((loc, message),) = errors_of(DeploymentSchema, body)
    assert loc == ["ray_actor_options", field]
    assert "not supported by kubeserve" in message


def test_null_for_a_defaulted_option_means_not_given() -> None:
    dep = parse_body(DeploymentSchema, {"name": "d", "max_concurrent_queries": None})
    assert dep.model_fields_set == {"name"}
    assert dep.as_given() == {"name": "d"}


def test_null_user_config_is_a_given_override() -> None:
    dep = parse_body(DeploymentSchema, {"name": "d", "user_config": None})
    assert dep.as_given() == {"name": "d", "user_config": None}


def test_deployment_name_is_required() -> None:
    assert errors_of(ServeDeploySchema, multi({"num_replicas": 1})) == [
        ([*DEP, "name"], "field required")
    ]


# --------------------------------------------------------------------------- autoscaling


def test_autoscaling_defaults_are_rays() -> None:
    dep = parse_body(DeploymentSchema, {"name": "d", "autoscaling_config": {}})
    auto = dep.autoscaling_config
    assert auto is not None
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 1, 2)
    assert (auto.look_back_period_s, auto.upscale_delay_s, auto.downscale_delay_s) == (30, 30, 600)
    assert dep.as_given() == {"name": "d", "autoscaling_config": {}}


def test_autoscaling_min_must_not_exceed_max() -> None:
    parse_body(
        DeploymentSchema,
        {"name": "d", "autoscaling_config": {"min_replicas": 2, "max_replicas": 2}},
    )
    body = multi({"name": "d", "autoscaling_config": {"min_replicas": 3, "max_replicas": 2}})
    assert locs_of(ServeDeploySchema, body) == [[*DEP, "autoscaling_config", "max_replicas"]]


def test_autoscaling_initial_replicas_within_bounds() -> None:
    auto = {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 5}
    assert locs_of(DeploymentSchema, {"name": "d", "autoscaling_config": auto}) == [
        ["autoscaling_config", "initial_replicas"]
    ]


@pytest.mark.parametrize("num_replicas", ["auto", None])
def test_autoscaling_allows_auto_or_null_num_replicas(num_replicas: Any) -> None:
    parse_body(
        DeploymentSchema, {"name": "d", "num_replicas": num_replicas, "autoscaling_config": {}}
    )


def test_integer_num_replicas_with_autoscaling_is_an_error() -> None:
    body = multi({"name": "d", "num_replicas": 2, "autoscaling_config": {"max_replicas": 3}})
    assert locs_of(ServeDeploySchema, body) == [[*DEP, "num_replicas"]]


def test_external_scaler_excludes_builtin_autoscaling() -> None:
    body = multi({"name": "d", "autoscaling_config": {}}, external_scaler_enabled=True)
    assert locs_of(ServeDeploySchema, body) == [[*DEP, "autoscaling_config"]]


# --------------------------------------------------------------------------- route prefix


@pytest.mark.parametrize("prefix", ["/", "/a", "/a/b", None])
def test_route_prefix_accepted(prefix: str | None) -> None:
    parse_body(ServeApplicationSchema, {"import_path": "a:b", "route_prefix": prefix})


def test_a_deployment_route_prefix_is_refused() -> None:
    parse_body(DeploymentSchema, {"name": "d", "route_prefix": None})
    ((loc, message),) = errors_of(DeploymentSchema, {"name": "d", "route_prefix": "/a"})
    assert loc == ["route_prefix"] and "set the application's route_prefix" in message


@pytest.mark.parametrize("prefix", ["a", "/a/", "//", "", "/{x}"])
def test_route_prefix_rejected(prefix: str) -> None:
    body = {
        "import_path": "a:b",
        "route_prefix": prefix,
        "deployments": [{"name": "d", "route_prefix": prefix}],
    }
    assert sorted(map(str, locs_of(ServeApplicationSchema, body))) == sorted(
        [str(["route_prefix"]), str(["deployments", 0, "route_prefix"])]
    )


# --------------------------------------------------------------------------- runtime_env URIs


@pytest.mark.parametrize(
    "uri",
    ["https://example.com/app.zip", "http://h:8080/a.zip", "s3://bucket/a.zip", "gs://b/a.zip"],
)
def test_remote_working_dir_accepted(uri: str) -> None:
    parse_body(ServeApplicationSchema, {"import_path": "a:b", "runtime_env": {"working_dir": uri}})


@pytest.mark.parametrize(
    "uri", ["/home/me/app", "./app", "app.zip", "file:///tmp/a.zip", "https:///a.zip", "local://x"]
)
def test_local_working_dir_rejected(uri: str) -> None:
    [(loc, msg)] = errors_of(
        ServeApplicationSchema, {"import_path": "a:b", "runtime_env": {"working_dir": uri}}
    )
    assert loc == ["runtime_env", "working_dir"]
    assert "remote URI" in msg and "local paths are not supported" in msg


def test_py_modules_must_be_remote_uris_with_index_in_path() -> None:
    env = {"py_modules": ["https://example.com/a.zip", "/tmp/mod"]}
    body = multi({"name": "d", "ray_actor_options": {"runtime_env": env}})
    assert locs_of(ServeDeploySchema, body) == [
        [*DEP, "ray_actor_options", "runtime_env", "py_modules", 1]
    ]


def test_env_vars_are_strings() -> None:
    parse_body(
        ServeApplicationSchema, {"import_path": "a:b", "runtime_env": {"env_vars": {"A": "1"}}}
    )
    body = {"import_path": "a:b", "runtime_env": {"env_vars": {"A": 1}}}
    assert locs_of(ServeApplicationSchema, body) == [["runtime_env", "env_vars", "A"]]


# --------------------------------------------------------------------------- import path


@pytest.mark.parametrize("path", ["a.b:c", "a.b.c", "a:b", "pkg_1.mod:App_2"])
def test_import_path_accepted(path: str) -> None:
    parse_body(ServeApplicationSchema, {"import_path": path})


@pytest.mark.parametrize(
    "path", ["a", ":b", "a:", "a..b", "a b:c", "1a:b", "a:b:c", "a.class:b", ""]
)
def test_import_path_rejected(path: str) -> None:
    assert locs_of(ServeApplicationSchema, {"import_path": path}) == [["import_path"]]


def test_import_path_is_required() -> None:
    assert errors_of(ServeDeploySchema, {"applications": [{"name": "x"}]}) == [
        (["applications", 0, "import_path"], "field required")
    ]


# --------------------------------------------------------------------------- applications


def test_single_app_defaults() -> None:
    app = parse_body(ServeApplicationSchema, {"import_path": "a:b"})
    assert (app.name, app.route_prefix, app.host, app.port) == ("", "/", "0.0.0.0", 8000)
    assert app.deployments == [] and app.args == {} and app.external_scaler_enabled is False
    assert app.as_given() == {"import_path": "a:b"}


def test_multi_app_element_default_name_is_rays() -> None:
    config = parse_body(ServeDeploySchema, {"applications": [{"import_path": "a:b"}]})
    assert config.applications[0].name == "default"


@pytest.mark.parametrize(("port", "ok"), [(1, True), (65535, True), (0, False), (65536, False)])
def test_port_range(port: int, ok: bool) -> None:
    body = {"import_path": "a:b", "port": port}
    if ok:
        parse_body(ServeApplicationSchema, body)
    else:
        assert locs_of(ServeApplicationSchema, body) == [["port"]]


def test_deployment_names_unique_within_an_app() -> None:
    parse_body(
        ServeApplicationSchema,
        {"import_path": "a:b", "deployments": [{"name": "x"}, {"name": "y"}]},
    )
    body = multi({"name": "x"}, {"name": "x"})
    assert locs_of(ServeDeploySchema, body) == [["applications", 0, "deployments", 1, "name"]]


def test_application_names_unique_and_non_empty() -> None:
    apps = [{"name": "a", "import_path": "m:a", "route_prefix": "/a"}]
    parse_body(ServeDeploySchema, {"applications": apps})
    dup = [*apps, {"name": "a", "import_path": "m:b", "route_prefix": "/b"}]
    assert locs_of(ServeDeploySchema, {"applications": dup}) == [["applications", 1, "name"]]
    empty = [{"name": "", "import_path": "m:b"}]
    assert locs_of(ServeDeploySchema, {"applications": empty}) == [["applications", 0, "name"]]


def test_route_prefixes_unique_across_apps_but_null_never_conflicts() -> None:
    apps = [
        {"name": "a", "import_path": "m:a", "route_prefix": None},
        {"name": "b", "import_path": "m:b", "route_prefix": None},
        {"name": "c", "import_path": "m:c"},
    ]
    parse_body(ServeDeploySchema, {"applications": apps})
    apps.append({"name": "d", "import_path": "m:d", "route_prefix": "/"})
    assert locs_of(ServeDeploySchema, {"applications": apps}) == [
        ["applications", 3, "route_prefix"]
    ]


def test_app_host_and_port_must_agree_with_http_options() -> None:
    same = {"http_options": {"port": 9001}, "applications": [{"import_path": "m:a", "port": 9001}]}
    parse_body(ServeDeploySchema, same)
    other = {"http_options": {"port": 9001}, "applications": [{"import_path": "m:a", "port": 8000}]}
    assert locs_of(ServeDeploySchema, other) == [["applications", 0, "port"]]
    host = {"applications": [{"import_path": "m:a", "host": "127.0.0.1"}]}
    assert locs_of(ServeDeploySchema, host) == [["applications", 0, "host"]]


def test_applications_is_required() -> None:
    assert errors_of(ServeDeploySchema, {}) == [(["applications"], "field required")]


# --------------------------------------------------------------------------- serving layer


def test_serving_layer_defaults_are_rays() -> None:
    config = parse_body(ServeDeploySchema, {"applications": []})
    dumped = config.model_dump(mode="json")
    schema = json.loads(RAY_SCHEMA.read_text())
    assert dumped["http_options"] == schema["properties"]["http_options"]["default"]
    assert dumped["grpc_options"] == schema["properties"]["grpc_options"]["default"]
    assert dumped["proxy_location"] == "EveryNode"
    assert dumped["target_capacity"] is None


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"proxy_location": "Nowhere"}, ["proxy_location"]),
        ({"target_capacity": 101}, ["target_capacity"]),
        ({"target_capacity": -1}, ["target_capacity"]),
        ({"http_options": {"ssl_keyfile": "k.pem"}}, ["http_options", "ssl_certfile"]),
        (
            {"grpc_options": {"grpc_servicer_functions": ["nope"]}},
            ["grpc_options", "grpc_servicer_functions", 0],
        ),
        (
            {"controller_options": {"runtime_env": {"pip": ["x"]}}},
            ["controller_options", "runtime_env", "pip"],
        ),
        ({"logging_config": {"log_level": "LOUD"}}, ["logging_config", "log_level"]),
        ({"tracing_config": {"sampling_ratio": 2}}, ["tracing_config", "sampling_ratio"]),
        ({"tracing_config": {"sampling_ratio": -0.1}}, ["tracing_config", "sampling_ratio"]),
        (
            {"tracing_config": {"enabled": True, "exporter_import_path": "otel setup"}},
            ["tracing_config", "exporter_import_path"],
        ),
    ],
)
def test_serving_layer_rules(body: dict[str, Any], loc: list[Any]) -> None:
    assert locs_of(ServeDeploySchema, {"applications": [], **body}) == [loc]


def test_serving_layer_valid_values() -> None:
    body = {
        "applications": [],
        "proxy_location": "HeadOnly",
        "target_capacity": 50,
        "logging_config": {"log_level": "info", "encoding": "TEXT"},
        "controller_options": {"runtime_env": {}},
        "tracing_config": {
            "enabled": True,
            "exporter_import_path": "otel_setup.exporters:otlp",
            "sampling_ratio": 0.5,
        },
        "grpc_options": {"port": 9001, "grpc_servicer_functions": []},
    }
    config = parse_body(ServeDeploySchema, body)
    assert config.logging_config is not None and config.logging_config.log_level == "INFO"


# --------------------------------------------------------------------------- round trip and bodies


FULL_CONFIG: dict[str, Any] = {
    "proxy_location": "EveryNode",
    "http_options": {"host": "0.0.0.0", "port": 8000},
    "applications": [
        {
            "name": "app1",
            "route_prefix": "/app1",
            "import_path": "golden_app:app",
            "runtime_env": {"working_dir": "https://example.com/app.zip", "env_vars": {"A": "1"}},
            "args": {"greeting": "hi"},
            "deployments": [
                {"name": "Greeter", "user_config": {"x": 1}},
                {
                    "name": "Model",
                    "num_replicas": "auto",
                    "max_ongoing_requests": 10,
                    "autoscaling_config": {"min_replicas": 0, "max_replicas": 5},
                    "ray_actor_options": {"num_cpus": 0.5, "runtime_env": {"env_vars": {"B": "2"}}},
                },
            ],
        },
        {"name": "app2", "route_prefix": None, "import_path": "other.mod.app"},
    ],
}


def test_config_round_trips_through_its_stored_form() -> None:
    config = parse_body(ServeDeploySchema, FULL_CONFIG)
    stored = config.as_given()
    assert parse_body(ServeDeploySchema, stored).as_given() == stored
    assert stored["applications"][0]["deployments"][0] == {
        "name": "Greeter",
        "user_config": {"x": 1},
    }


def test_raw_json_bodies_and_malformed_json() -> None:
    assert parse_body(ServeApplicationSchema, b'{"import_path": "a:b"}').import_path == "a:b"
    [(loc, msg)] = errors_of(ServeApplicationSchema, b"{not json")
    assert loc == [] and "json" in msg.lower()
    assert errors_of(ServeApplicationSchema, b"[1]") == [([], "expected a JSON object")]


def test_messages_carry_no_pydantic_urls_or_prefixes() -> None:
    for _, msg in errors_of(
        ServeDeploySchema, multi({"name": "d", "num_replicas": 2, "autoscaling_config": {}})
    ):
        assert "pydantic" not in msg and not msg.startswith("Value error")


def test_our_defaults_accept_every_field_of_rays_deployment_schema() -> None:
    ray = json.loads(RAY_SCHEMA.read_text())["$defs"]
    for ours, theirs in [
        (DeploymentSchema, "DeploymentSchema"),
        (ServeApplicationSchema, "ServeApplicationSchema"),
        (ServeDeploySchema, None),
    ]:
        props = (
            ray[theirs]["properties"]
            if theirs
            else json.loads(RAY_SCHEMA.read_text())["properties"]
        )
        assert set(props) <= set(ours.model_fields), theirs
