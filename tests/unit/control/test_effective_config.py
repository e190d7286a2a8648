"""Effective deployment config: Ray 2.60 defaults <- code options <- config overrides."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from kubeserve.control.effective_config import (
    EffectiveDeployment,
    effective_deployment,
    graph_configs,
    replica_version,
)
from kubeserve.control.instance import (
    app_route_prefix,
    grpc_proxy_arguments,
    immutable_option_conflict,
)
from kubeserve.schema.config import DeploymentSchema

#: Ray 2.60's autoscaling defaults, as an effective ``autoscaling_config`` spells them.
_SCALING = {
    "min_replicas": 1,
    "initial_replicas": None,
    "max_replicas": 1,
    "target_ongoing_requests": 2.0,
    "metrics_interval_s": 10.0,
    "look_back_period_s": 30.0,
    "smoothing_factor": 1.0,
    "upscale_smoothing_factor": None,
    "downscale_smoothing_factor": None,
    "upscaling_factor": None,
    "downscaling_factor": None,
    "downscale_delay_s": 600.0,
    "downscale_to_zero_delay_s": None,
    "upscale_delay_s": 30.0,
    "aggregation_function": "mean",
}
_DEFAULTS: dict[str, Any] = {
    "name": "D",
    "num_replicas": 1,
    "max_ongoing_requests": 5,
    "max_queued_requests": -1,
    "backpressure_config": {"status_code": 503, "retry_after_s": None},
    "user_config": None,
    "autoscaling_config": None,
    "graceful_shutdown_wait_loop_s": 2.0,
    "graceful_shutdown_timeout_s": 20.0,
    "health_check_period_s": 10.0,
    "health_check_timeout_s": 30.0,
    "ray_actor_options": {"runtime_env": {}, "num_cpus": 1.0},
    "is_driver_deployment": False,
    "request_router_config": {
        "request_router_class": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
        "request_router_kwargs": {},
        "request_routing_stats_period_s": 10,
        "request_routing_stats_timeout_s": 30,
        "initial_backoff_s": 0.025,
        "backoff_multiplier": 2,
        "max_backoff_s": 0.5,
    },
}


def test_defaults_are_ray_2_60s() -> None:
    config = effective_deployment("D", {}, None)
    assert config == EffectiveDeployment("D")
    assert config.as_dict() == _DEFAULTS
    assert list(config.as_dict()) == list(_DEFAULTS)


def test_every_field_is_a_deployment_schema_field_and_the_dict_validates() -> None:
    assert {f.name for f in fields(EffectiveDeployment)} <= set(DeploymentSchema.model_fields)
    auto = effective_deployment("D", {"num_replicas": "auto", "logging_config": {}}, None)
    for config in (EffectiveDeployment("D"), auto):
        DeploymentSchema.model_validate(config.as_dict())


def test_the_dict_is_what_details_report() -> None:
    """The REST spelling, field for field, as the details have always reported it."""
    code = {"num_replicas": 2, "max_concurrent_queries": 3, "logging_config": {"log_level": "X"}}
    overrides = {
        "name": "D",
        "max_queued_requests": None,
        "backpressure_config": {"status_code": 503},
        "autoscaling_config": {"min_replicas": 0, "max_replicas": 3},
        "graceful_shutdown_timeout_s": 5,
    }
    config = effective_deployment("D", code, overrides, {"encoding": "JSON"})
    assert config.as_dict() == {
        **_DEFAULTS,
        "num_replicas": None,
        "max_ongoing_requests": 3,
        "max_queued_requests": None,
        "backpressure_config": {"status_code": 503, "retry_after_s": None},  # Ray's default filled
        "autoscaling_config": {**_SCALING, "min_replicas": 0, "max_replicas": 3},
        "graceful_shutdown_timeout_s": 5.0,
        "logging_config": {"encoding": "JSON"},
    }
    assert config.target_replicas() == 0


def test_overrides_beat_code_which_beats_defaults() -> None:
    code = {"num_replicas": 2, "max_ongoing_requests": 9, "user_config": {"a": 1}}
    overrides = {"name": "D", "num_replicas": 4}
    config = effective_deployment("D", code, overrides)
    assert config.num_replicas == 4
    assert config.max_ongoing_requests == 9
    assert config.user_config == {"a": 1}


def test_old_spellings_are_the_same_settings() -> None:
    config = effective_deployment(
        "D", {"max_concurrent_queries": 3}, {"cluster_actor_options": {"num_cpus": 0.5}}
    )
    assert config.max_ongoing_requests == 3
    assert config.ray_actor_options == {"num_cpus": 0.5}


def test_autoscaling_target_starts_at_initial_or_min() -> None:
    config = effective_deployment("D", {}, {"autoscaling_config": {"min_replicas": 2}})
    assert config.autoscaling_config is not None
    assert config.autoscaling_config["upscale_delay_s"] == 30
    assert config.target_replicas() == 2
    auto = effective_deployment("D", {"num_replicas": "auto"}, None)
    assert auto.autoscaling_config is not None
    assert auto.autoscaling_config["target_ongoing_requests"] == 2.0
    assert auto.target_replicas() == 1
    initial = effective_deployment(
        "D",
        {},
        {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 3, "max_replicas": 5}},
    )
    assert initial.target_replicas() == 3


def test_graph_configs_apply_each_override_to_its_node_in_graph_order() -> None:
    app = {
        "deployments": [{"name": "B", "num_replicas": 3}],
        "logging_config": {"log_level": "DEBUG"},
    }
    nodes = [{"name": "A", "options": {"num_replicas": 2}}, {"name": "B"}]
    configs = graph_configs(app, nodes)
    assert list(configs) == ["A", "B"]
    assert (configs["A"].num_replicas, configs["B"].num_replicas) == (2, 3)
    assert configs["B"].logging_config == {"log_level": "DEBUG"}


def test_user_config_and_counts_do_not_change_the_replica_version() -> None:
    app = {"import_path": "m:app", "runtime_env": {"env_vars": {"A": "1"}}}
    base = effective_deployment("D", {}, None)
    changed = effective_deployment("D", {}, {"user_config": {"x": 2}, "num_replicas": 3})
    assert replica_version(app, base) == replica_version(app, changed)
    assert base.user_config_version != changed.user_config_version
    other_env = {**app, "runtime_env": {"env_vars": {"A": "2"}}}
    assert replica_version(app, base) != replica_version(other_env, base)
    cpus = effective_deployment("D", {}, {"ray_actor_options": {"num_cpus": 2}})
    assert replica_version(app, base) != replica_version(app, cpus)


def test_replica_versions_are_those_of_running_replicas() -> None:
    """The digests replicas started by an earlier kubeserve carry: no restart on upgrade."""
    app = {"import_path": "m:a"}
    assert replica_version(app, EffectiveDeployment("D")) == "199396e8e849fd63"
    logged = effective_deployment("D", {}, None, {"encoding": "JSON"})
    assert replica_version(app, logged) == "b2d19915d814bd3c"
    cpus = effective_deployment("D", {}, {"cluster_actor_options": {"num_cpus": 0.5}})
    assert replica_version(app, cpus) == "5e0d0d778ca57db9"


def test_required_resources_in_rays_spelling() -> None:
    config = effective_deployment(
        "D", {"ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1, "resources": {"tpu": 2}}}, None
    )
    assert config.required_resources() == {"CPU": 0.5, "GPU": 1.0, "tpu": 2.0}


def test_host_and_port_of_a_running_instance_are_immutable() -> None:
    running = {"http_options": {"host": "127.0.0.1", "port": 8000}}
    assert immutable_option_conflict(None, running) is None
    assert immutable_option_conflict(running, running) is None
    moved = {"http_options": {"host": "127.0.0.1", "port": 8001}}
    message = immutable_option_conflict(running, moved)
    assert message is not None and "port" in message and "DELETE" in message


def test_grpc_options_of_a_running_instance_are_immutable() -> None:
    running = {"grpc_options": {"port": 9000, "grpc_servicer_functions": []}}
    assert immutable_option_conflict(running, running) is None
    serving = {"grpc_options": {"port": 9000, "grpc_servicer_functions": ["m.add_S_to_server"]}}
    message = immutable_option_conflict(running, serving)
    assert message is not None and "grpc_options.grpc_servicer_functions" in message


def test_the_proxy_serves_grpc_only_with_servicer_functions() -> None:
    assert grpc_proxy_arguments(None) == []
    assert grpc_proxy_arguments({"port": 9001, "grpc_servicer_functions": []}) == []
    options = {"port": 9001, "grpc_servicer_functions": ["a.f", "b.g"], "request_timeout_s": 2}
    assert grpc_proxy_arguments(options) == [
        "--grpc-port",
        "9001",
        "--grpc-servicer-function",
        "a.f",
        "--grpc-servicer-function",
        "b.g",
        "--grpc-request-timeout-s",
        "2",
    ]
    no_reflection = {"grpc_servicer_functions": ["a.f"], "enable_reflection": False}
    assert grpc_proxy_arguments(no_reflection)[-1] == "--grpc-no-reflection"
    assert "--grpc-no-reflection" not in grpc_proxy_arguments(
        {**no_reflection, "enable_reflection": True}
    )


def test_grpc_reflection_is_fixed_while_serving_and_defaults_to_on() -> None:
    functions = {"port": 9000, "grpc_servicer_functions": ["m.add_S_to_server"]}
    running = {"grpc_options": functions}
    assert (
        immutable_option_conflict(
            running, {"grpc_options": {**functions, "enable_reflection": True}}
        )
        is None
    )
    message = immutable_option_conflict(
        running, {"grpc_options": {**functions, "enable_reflection": False}}
    )
    assert message is not None and "grpc_options.enable_reflection" in message
    assert "(True -> False)" in message


def test_app_route_prefix_precedence() -> None:
    assert app_route_prefix({"route_prefix": "/x"}, {"route_prefix": "/y"}) == "/x"
    assert app_route_prefix({"route_prefix": None}, {"route_prefix": "/y"}) is None
    assert app_route_prefix({}, {"route_prefix": "/y"}) == "/y"
    assert app_route_prefix({}, {}) == "/"
