"""Effective deployment configuration: code defaults <- options set in code <- config overrides.

A deployment's configuration comes from three places, most specific last:

1. kubeserve's defaults (Ray Serve 2.60's, so configs written for Ray mean the same thing here);
2. the options given in code (``@deployment(num_replicas=2)``, ``.options(...)``), as reported by
   the application build;
3. the overrides in the deployed config's ``deployments`` list (only the fields the client set).

Each field is taken whole from the most specific place that sets it (``ray_actor_options`` and
``autoscaling_config`` are not merged key by key, as in Ray). Everything here is pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kubeserve.control import autoscaling

#: Consecutive failed health checks after which a replica is replaced (Ray Serve's threshold); a
#: single failure only logs a warning, since one slow check under load is not a dead replica.
HEALTH_CHECK_FAILURE_THRESHOLD = 3

#: Ray Serve 2.60's defaults for every deployment option kubeserve acts on.
DEPLOYMENT_DEFAULTS: dict[str, Any] = {
    "num_replicas": 1,
    "max_ongoing_requests": 5,
    "max_queued_requests": -1,
    "backpressure_config": None,
    "user_config": None,
    "autoscaling_config": None,
    "graceful_shutdown_wait_loop_s": 2.0,
    "graceful_shutdown_timeout_s": 20.0,
    "health_check_period_s": 10.0,
    "health_check_timeout_s": 30.0,
    "ray_actor_options": {"runtime_env": {}, "num_cpus": 1.0},
    "is_driver_deployment": False,
}

#: Ray Serve 2.60's autoscaling defaults, filled under a given ``autoscaling_config``.
AUTOSCALING_DEFAULTS: dict[str, Any] = autoscaling.AUTOSCALING_DEFAULTS

#: Options that change what a replica process is; changing one replaces the replicas.
#: ``user_config`` is deliberately absent (applied in place through ``reconfigure``), and so are
#: the replica count and the router-side limits.
_PROCESS_FIELDS = ("ray_actor_options", "logging_config")

_ALIASES = {
    "max_concurrent_queries": "max_ongoing_requests",
    "cluster_actor_options": "ray_actor_options",
}


def _canonical(options: Mapping[str, Any]) -> dict[str, Any]:
    return {_ALIASES.get(k, k): v for k, v in options.items() if k != "name"}


def effective_deployment_config(
    name: str,
    code_options: Mapping[str, Any],
    overrides: Mapping[str, Any] | None,
    app_logging_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The full configuration a deployment runs with, every field filled.

    ``logging_config`` follows Ray's precedence: the deployment's in the config, else the
    application's (``app_logging_config``), else the decorator's; absent when none is given
    (Ray's defaults). A change of it replaces the replicas, which read it when they start.

    ``route_prefix`` is not part of it: routes are an application-level concern (see
    :func:`kubeserve.control.routes`), as in Ray Serve's multi-application model.
    """
    merged: dict[str, Any] = dict(DEPLOYMENT_DEFAULTS)
    for source in (_canonical(code_options), _canonical(overrides or {})):
        for key, value in source.items():
            if key in merged:
                merged[key] = value
        if source.get("num_replicas") == "auto":
            # Ray's "auto" defaults, under the autoscaling fields given with it (or before it)
            given = source.get("autoscaling_config") or merged["autoscaling_config"] or {}
            merged["autoscaling_config"] = {**autoscaling.AUTO_NUM_REPLICAS_DEFAULTS, **given}
    if merged["backpressure_config"] is None:
        del merged["backpressure_config"]  # Ray's schema has no null there: absent is the default
    if merged["autoscaling_config"] is not None:
        merged["autoscaling_config"] = {**AUTOSCALING_DEFAULTS, **merged["autoscaling_config"]}
        merged["num_replicas"] = None
    logging_config = (
        (overrides or {}).get("logging_config")
        or app_logging_config
        or code_options.get("logging_config")
    )
    if logging_config:
        merged["logging_config"] = dict(logging_config)
    return {"name": name, **merged}


def target_replicas(
    config: Mapping[str, Any],
    target_capacity: float | None = None,
    capacity_direction: autoscaling.Direction | None = None,
) -> int:
    """The replica count a deployment starts from, ``target_capacity`` applied.

    A fixed ``num_replicas`` is scaled by the capacity. With autoscaling, the count starts at
    ``initial_replicas`` (else ``min_replicas``); the autoscaling policy moves it within
    ``[min_replicas, max_replicas]`` (both scaled by the capacity) later.
    """
    raw = config.get("autoscaling_config")
    if raw:
        policy = autoscaling.AutoscalingConfig.from_mapping(raw)
        return autoscaling.initial_target(policy, target_capacity, capacity_direction)
    return autoscaling.capacity_adjusted(int(config["num_replicas"]), target_capacity)


def fingerprint(value: Any) -> str:
    """A stable short digest of JSON-able data (key order does not matter)."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def replica_version(app_config: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """Identifies what a replica process runs; replicas of another version are replaced.

    It covers the code (import path), the environment (runtime_env) and the process options, and
    excludes ``user_config`` and the counts, which change without a restart.
    """
    return fingerprint(
        {
            "import_path": app_config.get("import_path"),
            "runtime_env": app_config.get("runtime_env") or {},
            "args": app_config.get("args") or {},
            **{field: config.get(field) for field in _PROCESS_FIELDS},
        }
    )


def user_config_version(config: Mapping[str, Any]) -> str:
    return fingerprint(config.get("user_config"))


def required_resources(config: Mapping[str, Any]) -> dict[str, float]:
    """Resources one replica asks for, in Ray's spelling (``CPU``, ``GPU``, ``memory``, custom)."""
    options = config.get("ray_actor_options") or {}
    resources: dict[str, float] = {}
    if options.get("num_cpus") is not None:
        resources["CPU"] = float(options["num_cpus"])
    if options.get("num_gpus"):
        resources["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        resources["memory"] = float(options["memory"])
    for key, value in (options.get("resources") or {}).items():
        resources[key] = float(value)
    return resources


def unknown_override_error(
    overrides: Iterable[Mapping[str, Any]], deployment_names: Iterable[str]
) -> str | None:
    """Why a config's ``deployments`` overrides cannot apply to the built graph, or ``None``.

    An override naming a deployment the application does not have is an error, as in Ray Serve
    2.60 (whose message is ``Deployment 'X' does not exist. Available: [...]``): silently ignoring
    it would leave the user believing a setting took effect. Every unknown name is listed.
    """
    available = list(deployment_names)
    unknown = [str(o.get("name")) for o in overrides if o.get("name") not in available]
    if not unknown:
        return None
    if len(unknown) == 1:
        return f"Deployment {unknown[0]!r} does not exist. Available: {available}"
    names = ", ".join(repr(name) for name in unknown)
    return f"Deployments {names} do not exist. Available: {available}"


def runtime_env_key_paths(
    app_config: Mapping[str, Any], keys: Iterable[str]
) -> list[list[str | int]]:
    """Where an application config (REST spelling) sets one of the runtime_env ``keys``.

    Paths are relative to the application: ``["runtime_env", key]`` and
    ``["deployments", i, "ray_actor_options", "runtime_env", key]``; a null value sets nothing.
    """
    wanted = set(keys)
    envs: list[tuple[list[str | int], Any]] = [(["runtime_env"], app_config.get("runtime_env"))]
    for i, override in enumerate(app_config.get("deployments") or []):
        options = override.get("ray_actor_options") or {}
        envs.append(
            (["deployments", i, "ray_actor_options", "runtime_env"], options.get("runtime_env"))
        )
    return [
        [*at, key]
        for at, env in envs
        for key in sorted(wanted & set(env or {}))
        if (env or {}).get(key) is not None
    ]
