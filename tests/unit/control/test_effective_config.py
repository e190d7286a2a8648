"""Effective deployment config: Ray 2.60 defaults <- code options <- config overrides."""

from __future__ import annotations

from kubeserve.control.effective_config import (
    effective_deployment_config,
    replica_version,
    required_resources,
    target_replicas,
    user_config_version,
)
from kubeserve.control.instance import app_route_prefix, immutable_option_conflict


def test_defaults_are_ray_2_60s() -> None:
    config = effective_deployment_config("D", {}, None)
    assert config["num_replicas"] == 1
    assert config["max_ongoing_requests"] == 5
    assert config["graceful_shutdown_wait_loop_s"] == 2
    assert config["graceful_shutdown_timeout_s"] == 20
    assert config["health_check_period_s"] == 10
    assert config["health_check_timeout_s"] == 30
    assert config["user_config"] is None


def test_overrides_beat_code_which_beats_defaults() -> None:
    code = {"num_replicas": 2, "max_ongoing_requests": 9, "user_config": {"a": 1}}
    overrides = {"name": "D", "num_replicas": 4}
    config = effective_deployment_config("D", code, overrides)
    assert config["num_replicas"] == 4
    assert config["max_ongoing_requests"] == 9
    assert config["user_config"] == {"a": 1}


def test_old_spellings_are_the_same_settings() -> None:
    config = effective_deployment_config(
        "D", {"max_concurrent_queries": 3}, {"cluster_actor_options": {"num_cpus": 0.5}}
    )
    assert config["max_ongoing_requests"] == 3
    assert config["ray_actor_options"] == {"num_cpus": 0.5}


def test_autoscaling_target_starts_at_initial_or_min() -> None:
    config = effective_deployment_config("D", {}, {"autoscaling_config": {"min_replicas": 2}})
    assert config["autoscaling_config"]["upscale_delay_s"] == 30
    assert target_replicas(config) == 2
    auto = effective_deployment_config("D", {"num_replicas": "auto"}, None)
    assert auto["autoscaling_config"]["target_ongoing_requests"] == 2.0
    assert target_replicas(auto) == 1
    initial = effective_deployment_config(
        "D",
        {},
        {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 3, "max_replicas": 5}},
    )
    assert target_replicas(initial) == 3


def test_user_config_and_counts_do_not_change_the_replica_version() -> None:
    app = {"import_path": "m:app", "runtime_env": {"env_vars": {"A": "1"}}}
    base = effective_deployment_config("D", {}, None)
    changed = effective_deployment_config("D", {}, {"user_config": {"x": 2}, "num_replicas": 3})
    assert replica_version(app, base) == replica_version(app, changed)
    assert user_config_version(base) != user_config_version(changed)
    other_env = {**app, "runtime_env": {"env_vars": {"A": "2"}}}
    assert replica_version(app, base) != replica_version(other_env, base)
    cpus = effective_deployment_config("D", {}, {"ray_actor_options": {"num_cpus": 2}})
    assert replica_version(app, base) != replica_version(app, cpus)


def test_required_resources_in_rays_spelling() -> None:
    config = effective_deployment_config(
        "D", {"ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1, "resources": {"tpu": 2}}}, None
    )
    assert required_resources(config) == {"CPU": 0.5, "GPU": 1.0, "tpu": 2.0}


def test_host_and_port_of_a_running_instance_are_immutable() -> None:
    running = {"http_options": {"host": "127.0.0.1", "port": 8000}}
    assert immutable_option_conflict(None, running) is None
    assert immutable_option_conflict(running, running) is None
    moved = {"http_options": {"host": "127.0.0.1", "port": 8001}}
    message = immutable_option_conflict(running, moved)
    assert message is not None and "port" in message and "DELETE" in message


def test_app_route_prefix_precedence() -> None:
    assert app_route_prefix({"route_prefix": "/x"}, {"route_prefix": "/y"}) == "/x"
    assert app_route_prefix({"route_prefix": None}, {"route_prefix": "/y"}) is None
    assert app_route_prefix({}, {"route_prefix": "/y"}) == "/y"
    assert app_route_prefix({}, {}) == "/"
