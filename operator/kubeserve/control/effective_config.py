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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kubeserve.control import autoscaling
from kubeserve.control.fingerprint import fingerprint
from kubeserve.control.rollout import RolloutPolicy
from kubeserve.schema.imperative import GRAPH_DIGEST_KEY

__all__ = [
    "AUTOSCALING_DEFAULTS",
    "HEALTH_CHECK_FAILURE_THRESHOLD",
    "EffectiveDeployment",
    "effective_deployment",
    "fingerprint",
    "graph_configs",
    "replica_version",
    "runtime_env_key_paths",
    "unknown_override_error",
]

#: Consecutive failed health checks after which a replica is replaced (Ray Serve's threshold); a
#: single failure only logs a warning, since one slow check under load is not a dead replica.
HEALTH_CHECK_FAILURE_THRESHOLD = 3

#: Ray Serve 2.60's autoscaling defaults, filled under a given ``autoscaling_config``.
AUTOSCALING_DEFAULTS: Mapping[str, Any] = autoscaling.AUTOSCALING_DEFAULTS


def _default_actor_options() -> dict[str, Any]:
    return {"runtime_env": {}, "num_cpus": 1.0}


#: Ray 2.60's ``backpressure_config`` when nothing sets it: a 503 without ``Retry-After``.
DEFAULT_BACKPRESSURE: Mapping[str, Any] = {"status_code": 503, "retry_after_s": None}
#: Ray 2.60's ``request_router_config`` when nothing sets it: its power-of-two-choices router
#: (kubeserve's, see :mod:`kubeserve.runtime.router`) with its timing defaults.
DEFAULT_REQUEST_ROUTER: Mapping[str, Any] = {
    "request_router_class": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    "request_router_kwargs": {},
    "request_routing_stats_period_s": 10,
    "request_routing_stats_timeout_s": 30,
    "initial_backoff_s": 0.025,
    "backoff_multiplier": 2,
    "max_backoff_s": 0.5,
}


@dataclass(frozen=True)
class EffectiveDeployment:
    """The full configuration a deployment runs with, every field filled.

    The field defaults are Ray Serve 2.60's for every deployment option kubeserve acts on, stated
    here only; every field is a :class:`~kubeserve.schema.config.DeploymentSchema` field (a test
    pins it), so :meth:`as_dict` is a valid ``deployment_config``. Invariants: under autoscaling,
    ``autoscaling_config`` has every field of Ray's defaults filled and ``num_replicas`` is
    ``None``; ``logging_config`` is ``None`` when nothing sets it (Ray's defaults). Only
    :meth:`as_dict` (details), the renderers and the replica's config file serialize it.

    ``max_queued_requests`` is ``None`` (no limit, like -1) and ``num_replicas`` is ``None``
    without autoscaling only when a config gives them as null.
    """

    name: str
    num_replicas: int | None = 1
    max_ongoing_requests: int = 5
    max_queued_requests: int | None = -1
    backpressure_config: Mapping[str, Any] | None = None
    user_config: Any = None
    autoscaling_config: Mapping[str, Any] | None = None
    graceful_shutdown_wait_loop_s: float = 2.0
    graceful_shutdown_timeout_s: float = 20.0
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    ray_actor_options: Mapping[str, Any] = field(default_factory=_default_actor_options)
    is_driver_deployment: bool | None = False
    logging_config: Mapping[str, Any] | None = None
    request_router_config: Mapping[str, Any] | None = None
    #: Ray's rollout knobs; ``None`` when nothing sets them (the backend's default rollout, see
    #: :meth:`rollout`)
    rolling_update_percentage: float | None = None
    max_surge_percent: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The REST spelling (``deployment_config`` of the details): the configs nothing set are
        Ray's defaults, as Ray reports them (``logging_config`` aside, absent as in Ray's
        answer when nothing sets it)."""
        body = asdict(self)
        for unset in ("logging_config", "rolling_update_percentage", "max_surge_percent"):
            if body[unset] is None:  # the details fill the rollout in (the backend decides it)
                del body[unset]
        body["backpressure_config"] = {**DEFAULT_BACKPRESSURE, **(self.backpressure_config or {})}
        body["request_router_config"] = {
            **DEFAULT_REQUEST_ROUTER,
            **(self.request_router_config or {}),
        }
        return body

    def target_replicas(
        self,
        target_capacity: float | None = None,
        capacity_direction: autoscaling.Direction | None = None,
    ) -> int:
        """The replica count the deployment starts from, ``target_capacity`` applied.

        A fixed ``num_replicas`` is scaled by the capacity. With autoscaling, the count starts at
        ``initial_replicas`` (else ``min_replicas``); the autoscaling policy moves it within
        ``[min_replicas, max_replicas]`` (both scaled by the capacity) later.
        """
        if self.autoscaling_config:
            policy = autoscaling.AutoscalingConfig.from_mapping(self.autoscaling_config)
            return autoscaling.initial_target(policy, target_capacity, capacity_direction)
        if self.num_replicas is None:
            raise ValueError(f"deployment {self.name!r}: num_replicas is null")
        return autoscaling.capacity_adjusted(self.num_replicas, target_capacity)

    @property
    def custom_request_router(self) -> str | None:
        """The ``request_router_class`` the deployment names, or None for Ray's default policy
        (kubeserve's built-in router)."""
        path = (self.request_router_config or {}).get("request_router_class")
        default = DEFAULT_REQUEST_ROUTER["request_router_class"]
        if not path or path in (default, default.replace(":", ".")):
            return None
        return str(path)

    def rollout(self, default: RolloutPolicy) -> RolloutPolicy:
        """How the deployment replaces its replicas, ``default`` being the backend's when the
        config sets neither knob (:meth:`RolloutPolicy.given`)."""
        return RolloutPolicy.given(self.rolling_update_percentage, self.max_surge_percent, default)

    @property
    def user_config_version(self) -> str:
        """Identifies the ``user_config`` a replica applied (changed in place, no restart)."""
        return fingerprint(self.user_config)

    @property
    def actor_runtime_env(self) -> Mapping[str, Any] | None:
        """The deployment's own ``runtime_env`` (merged over the application's)."""
        env: Mapping[str, Any] | None = self.ray_actor_options.get("runtime_env")
        return env

    def required_resources(self) -> dict[str, float]:
        """Resources one replica asks for, in Ray's spelling (``CPU``, ``GPU``, ``memory``,
        custom)."""
        options = self.ray_actor_options
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


#: The options taken whole from the most specific place that sets them (``logging_config`` has
#: its own precedence; ``name`` is the deployment's).
_TAKEN_WHOLE = frozenset(f.name for f in fields(EffectiveDeployment)) - {"name", "logging_config"}

#: Options that change what a replica process is; changing one replaces the replicas.
#: ``user_config`` is deliberately absent (applied in place through ``reconfigure``), and so are
#: the replica count and the router-side limits.
_PROCESS_FIELDS = ("ray_actor_options", "logging_config")

_ALIASES = {
    "max_concurrent_queries": "max_ongoing_requests",
    "cluster_actor_options": "ray_actor_options",
}

#: How a given value becomes its field's type (a given null stays null: see EffectiveDeployment).
_AS_TYPE: Mapping[str, Callable[[Any], Any]] = {
    "num_replicas": int,
    "max_ongoing_requests": int,
    "max_queued_requests": int,
    "graceful_shutdown_wait_loop_s": float,
    "graceful_shutdown_timeout_s": float,
    "health_check_period_s": float,
    "health_check_timeout_s": float,
    "rolling_update_percentage": float,
    "max_surge_percent": int,
}


def _canonical(options: Mapping[str, Any]) -> dict[str, Any]:
    return {_ALIASES.get(k, k): v for k, v in options.items() if k != "name"}


def effective_deployment(
    name: str,
    code_options: Mapping[str, Any],
    overrides: Mapping[str, Any] | None,
    app_logging_config: Mapping[str, Any] | None = None,
) -> EffectiveDeployment:
    """What deployment ``name`` runs with: defaults <- ``code_options`` <- ``overrides``.

    ``logging_config`` follows Ray's precedence: the deployment's in the config, else the
    application's (``app_logging_config``), else the decorator's; absent when none is given
    (Ray's defaults). A change of it replaces the replicas, which read it when they start.

    ``route_prefix`` is not part of it: routes are an application-level concern (see
    :func:`kubeserve.control.routes`), as in Ray Serve's multi-application model.
    """
    given: dict[str, Any] = {}
    for source in (_canonical(code_options), _canonical(overrides or {})):
        given.update((key, value) for key, value in source.items() if key in _TAKEN_WHOLE)
        if source.get("num_replicas") == "auto":
            # Ray's "auto" defaults, under the autoscaling fields given with it (or before it)
            auto = given.get("autoscaling_config") or {}
            given["autoscaling_config"] = {**autoscaling.AUTO_NUM_REPLICAS_DEFAULTS, **auto}
    if given.get("autoscaling_config") is not None:
        given["autoscaling_config"] = {**AUTOSCALING_DEFAULTS, **given["autoscaling_config"]}
        given["num_replicas"] = None
    for key, as_type in _AS_TYPE.items():
        if given.get(key) is not None:
            given[key] = as_type(given[key])
    logging_config = (
        (overrides or {}).get("logging_config")
        or app_logging_config
        or code_options.get("logging_config")
    )
    if logging_config:
        given["logging_config"] = dict(logging_config)
    return EffectiveDeployment(name=name, **given)


def graph_configs(
    app_config: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]
) -> dict[str, EffectiveDeployment]:
    """The effective config of every deployment of a built graph (its ``deployments`` nodes, in
    order), under the application config's overrides and ``logging_config``."""
    overrides = {d["name"]: d for d in app_config.get("deployments") or []}
    return {
        str(node["name"]): effective_deployment(
            str(node["name"]),
            node.get("options") or {},
            overrides.get(node["name"]),
            app_config.get("logging_config"),
        )
        for node in nodes
    }


def replica_version(app_config: Mapping[str, Any], config: EffectiveDeployment) -> str:
    """Identifies what a replica process runs; replicas of another version are replaced.

    It covers the code (import path, or an imperative application's pickled graph, and a custom
    ``request_router_class``, which replicas load at start-up), the environment (runtime_env)
    and the process options, and excludes ``user_config`` and the counts, which change without
    a restart.
    """
    code: dict[str, Any] = {"import_path": app_config.get("import_path")}
    if GRAPH_DIGEST_KEY in app_config:  # only then: a declarative replica's version is as it was
        code["graph"] = app_config[GRAPH_DIGEST_KEY]
    if config.custom_request_router is not None:  # replicas load it at start-up
        code["request_router_class"] = config.custom_request_router
    return fingerprint(
        {
            **code,
            "runtime_env": app_config.get("runtime_env") or {},
            "args": app_config.get("args") or {},
            **{name: getattr(config, name) for name in _PROCESS_FIELDS},
        }
    )


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
