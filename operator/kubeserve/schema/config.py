"""Request bodies of the admin API: application, deployment and serving-layer configuration.

The field set is Ray Serve 2.60's ``ServeDeploySchema`` so that configs written for Ray deploy
unchanged; where kubeserve's admin API states a stricter or older rule, it wins:

- unknown fields are rejected at every level (Ray silently ignores them);
- kubeserve's ``cluster_actor_options`` and Ray's ``ray_actor_options`` are one field, and so are
  the older ``max_concurrent_queries`` and Ray's ``max_ongoing_requests``: either spelling is
  accepted, giving both is an error, output uses Ray's name (the Ray client must parse it);
- for the fields documented as "a default is used when null" (``max_ongoing_requests`` and
  the four timing fields) a null is treated as *not given*, so the option set in code (or the
  default) applies and the value never reaches the output, where Ray's client would reject a null.

Deployment entries are *overrides* of options set in code: which fields the client gave is part of
the value (``model_fields_set``). Every optional override therefore defaults to ``None`` and code
must look at ``model_fields_set`` (or dump with ``exclude_unset=True``, see
  :meth:`RestModel.as_given`) to tell "not given" from "given as null"; a stored config
round-trips through :meth:`RestModel.as_given` and ``model_validate``.

Field names are the REST (snake_case) spelling. Custom resources will spell them in camelCase by
subclassing with an alias generator in :data:`REST_MODEL_CONFIG`'s place; nothing here depends on
field names being the wire names except the explicit ``validation_alias`` choices.
"""

from __future__ import annotations

import json
import keyword
import re
from enum import StrEnum
from functools import partial
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PlainSerializer,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kubeserve.schema import node_labels, support
from kubeserve.schema.errors import field_error
from kubeserve.schema.limits import (
    MAX_APPLICATIONS,
    MAX_DEPLOYMENTS_PER_APPLICATION,
    MAX_NAME_LENGTH,
    MAX_REPLICAS_PER_DEPLOYMENT,
    MIN_PERIOD_S,
)
from kubeserve.schema.packages import validate_packages

__all__ = [
    "DEFAULT_DATA_PATH",
    "REMOTE_URI_SCHEMES",
    "AutoscalingConfig",
    "AutoscalingPolicy",
    "BackpressureConfig",
    "ControllerOptions",
    "ControllerRuntimeEnv",
    "DataPath",
    "DeploymentActorConfig",
    "DeploymentSchema",
    "GRPCOptionsSchema",
    "GangSchedulingConfig",
    "HTTPOptionsSchema",
    "ImportPath",
    "LoggingConfig",
    "ProxyLocation",
    "RayActorOptionsSchema",
    "RemoteURI",
    "RequestRouterConfig",
    "RoutePrefix",
    "RuntimeEnv",
    "ServeApplicationEntry",
    "ServeApplicationSchema",
    "ServeDeploySchema",
    "TracingConfig",
]

#: Shared by every REST model. Unknown fields are an error (Ray ignores them; a typo must not
#: pass); NaN/inf are never a meaningful number of seconds or CPUs. The custom resources' camelCase
#: spelling (:mod:`kubeserve.schema.resources`) adds an alias generator to this.
REST_MODEL_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)


class RestModel(BaseModel):
    """Base of the REST bodies: strict about unknown fields, snake_case names.

    Fields kubeserve does not act on are refused here, for every model alike, when the client
    gives them a value that asks for something (:mod:`kubeserve.schema.support`).
    """

    model_config = REST_MODEL_CONFIG
    #: the name of the model in Ray's schema, the key of :data:`~kubeserve.schema.support.SUPPORT`
    ray_name: ClassVar[str] = ""

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> Self:
        # Custom-resource spec models re-attach this validator and set their own ``ray_name``.
        model = getattr(self, "ray_name", "") or type(self).__name__
        for field in sorted(self.model_fields_set):
            reason = support.refusal(model, field, getattr(self, field))
            if reason is not None:
                raise field_error(reason, field)
        return self

    def as_given(self) -> dict[str, Any]:
        """The body as the client gave it (fields it left out stay out), JSON-ready.

        This is what is stored, echoed back by GET (``deployed_app_config``) and compared for
        changes; it validates back into an equal model.
        """
        return self.model_dump(mode="json", exclude_unset=True)


# --------------------------------------------------------------------------- field types


def _check_import_path(value: str) -> str:
    """``pkg.mod:attr`` or ``pkg.mod.attr``: a dotted module path, then one attribute.

    Mirrors how Ray imports it (split on the single ``:``, else on the last ``.``), so a value that
    passes here is one the build step can at least attempt to import.
    """
    if value.count(":") > 1:
        raise PydanticCustomError("import_path", "import path may contain at most one ':'")
    if ":" in value:
        module, attr = value.split(":")
    else:
        module, _, attr = value.rpartition(".")
    parts = [*module.split("."), attr] if module else []
    if not parts or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise PydanticCustomError(
            "import_path",
            "invalid import path '{value}': expected 'module.submodule:attribute' or "
            "'module.submodule.attribute' (dotted Python identifiers)",
            {"value": value},
        )
    return value


# RFC 3986 path characters (unreserved, sub-delims, ':' and '@') and percent-encodings.
_SEGMENT = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})+")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _route_prefix_error(value: str, reason: str) -> PydanticCustomError:
    return PydanticCustomError(
        "route_prefix",
        "route prefix {value} {reason}",
        {"value": repr(value[:200]), "reason": reason},
    )


def _check_route_prefix(value: str) -> str:
    """Ray's rules (starts with '/', no trailing '/' except the catch-all '/', no wildcards), and
    one spelling per route: the proxy matches raw request paths segment by segment, so a prefix
    must be written the way requests spell it, in the canonical form of RFC 3986.

    Refused: empty, ``.`` and ``..`` segments (``//a``, ``/./a`` mean ``/a``); characters a request
    path cannot carry (space, ``?``, ``#``, controls, raw non-ASCII: write ``%C3%A9``);
    percent-encodings of characters that need none (``%61`` is ``a``), of ``/`` (``%2F``) or in
    lowercase hex; the proxy's own paths under ``/-/``. So two valid prefixes route the same
    requests exactly when they are the same string.
    """
    if not value.startswith("/"):
        raise _route_prefix_error(value, "must start with '/'")
    if len(value) > 1 and value.endswith("/"):
        raise _route_prefix_error(value, "must not end with '/' unless it is exactly '/'")
    if "{" in value or "}" in value:
        raise _route_prefix_error(value, "must not contain wildcards")
    if value == "/":
        return value
    segments = value[1:].split("/")
    if segments[0] == "-":
        raise _route_prefix_error(value, "is reserved: paths under '/-/' belong to the proxy")
    if any(segment in ("", ".", "..") for segment in segments):
        resolved: list[str] = []
        for segment in segments:
            if segment == "..":
                resolved = resolved[:-1]
            elif segment not in ("", "."):
                resolved.append(segment)
        raise _route_prefix_error(
            value,
            "has an empty, '.' or '..' segment, which requests never carry: write "
            f"{'/' + '/'.join(resolved)!r}",
        )
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            bad = next((c for c in segment if c != "%" and not _SEGMENT.fullmatch(c)), None)
            if bad is None:
                raise _route_prefix_error(value, "has a '%' not followed by two hex digits")
            raise _route_prefix_error(
                value,
                f"contains {bad!r}, which a request path cannot carry: percent-encode it "
                "(UTF-8 bytes, uppercase hex, such as %20 for a space)",
            )
        for code in re.findall(r"%(..)", segment):
            char = chr(int(code, 16))
            if char == "/":
                raise _route_prefix_error(
                    value, "has '%2F', an encoded '/', which proxies may decode: use '/'"
                )
            if char in _UNRESERVED or code != code.upper():
                hint = char if char in _UNRESERVED else "%" + code.upper()
                raise _route_prefix_error(
                    value,
                    f"has '%{code}', which requests spell {hint!r} (canonical form, RFC 3986)",
                )
    return value


#: URI schemes accepted in ``working_dir`` / ``py_modules``. The spec allows remote URIs only, so
#: ``file://`` and Ray's ``local://`` (a path already on the node) are rejected; the local
#: backend can fetch only http(s), the others are for backends with object-store access.
REMOTE_URI_SCHEMES = frozenset({"http", "https", "s3", "gs", "gcs", "azure", "abfss"})


def _check_remote_uri(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme.lower() not in REMOTE_URI_SCHEMES or not parts.netloc:
        raise PydanticCustomError(
            "remote_uri",
            "'{value}' is not a remote URI: working_dir and py_modules accept only remote URIs "
            "such as https://host/path/package.zip or s3://bucket/package.zip; local paths "
            "are not supported",
            {"value": value},
        )
    return value


# Words of letters, digits and '_', separated by '-' and spaces or by single dots.
_NAME = re.compile(r"[A-Za-z0-9_](?:[ -]*[A-Za-z0-9_]|\.[A-Za-z0-9_])*")


def _check_name(value: str) -> str:
    """Application and deployment names: what Ray users write ("default", "app1", "my_app",
    "text-ml.v2", "My App") and nothing that is unsafe where kubeserve puts names: log file
    names, process arguments, Kubernetes labels (shortened and hashed there), terminals.

    So no '/', '\\', '..', NUL or other control characters, no leading or trailing '-', '.' or
    space, at most :data:`~kubeserve.schema.limits.MAX_NAME_LENGTH` characters. The
    single-application family's default name ``""`` stays valid; multi-application configs and
    deployments require a name.
    """
    if value and (len(value) > MAX_NAME_LENGTH or not _NAME.fullmatch(value)):
        raise PydanticCustomError(
            "name",
            "invalid name {value}: use at most {limit} letters, digits and '_', separated by "
            "'-' and spaces or by single dots",
            {"value": repr(value[: MAX_NAME_LENGTH + 20]), "limit": MAX_NAME_LENGTH},
        )
    return value


Name = Annotated[
    str,
    AfterValidator(_check_name),
    Field(json_schema_extra={"pattern": f"^(?:{_NAME.pattern})?$", "maxLength": MAX_NAME_LENGTH}),
]


def _check_env_name(value: str) -> str:
    if not value or "=" in value or "\x00" in value:
        raise PydanticCustomError(
            "env_var",
            "environment variable name {value} must be non-empty, without '=' or NUL",
            {"value": repr(value[:100])},
        )
    return value


def _check_env_value(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("env_var", "environment variable values cannot contain NUL")
    return value


#: What a process environment can hold (``execve`` cannot pass NUL, nor '=' in a name).
EnvVars = dict[
    Annotated[str, AfterValidator(_check_env_name)],
    Annotated[str, AfterValidator(_check_env_value)],
]
ImportPath = Annotated[str, AfterValidator(_check_import_path)]
RoutePrefix = Annotated[str, AfterValidator(_check_route_prefix)]
RemoteURI = Annotated[str, AfterValidator(_check_remote_uri)]
Port = Annotated[int, Field(ge=1, le=65535)]


def _num_replicas(value: object) -> int | Literal["auto"] | None:
    # A plain validator gives one clear message instead of one error per union member.
    if value is None or value == "auto":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        if value > MAX_REPLICAS_PER_DEPLOYMENT:
            raise PydanticCustomError(
                "num_replicas",
                "num_replicas {value} is over the limit of {limit} replicas per deployment",
                {"value": value, "limit": MAX_REPLICAS_PER_DEPLOYMENT},
            )
        return value
    raise PydanticCustomError(
        "num_replicas", "num_replicas must be an integer greater than 0, 'auto' or null"
    )


#: How many replicas a deployment may ask for: 0 (autoscaling's floor) to the sanity cap.
ReplicaCount = Annotated[int, Field(ge=0, le=MAX_REPLICAS_PER_DEPLOYMENT)]
NumReplicas = Annotated[
    int | Literal["auto"] | None,
    PlainValidator(
        _num_replicas,
        json_schema_input_type=Annotated[int, Field(ge=1, le=MAX_REPLICAS_PER_DEPLOYMENT)]
        | Literal["auto"]
        | None,
    ),
]
#: Period of a loop (health checks, graceful-shutdown polls, metrics); see MIN_PERIOD_S.
Period = Annotated[float, Field(ge=MIN_PERIOD_S)]

_LOG_LEVELS = frozenset(
    {"CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET"}
)


def _log_level(value: object) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.upper() in _LOG_LEVELS:
        return value.upper()
    raise PydanticCustomError(
        "log_level",
        "log_level must be an integer or one of {levels}",
        {"levels": sorted(_LOG_LEVELS)},
    )


LogLevel = Annotated[int | str, PlainValidator(_log_level, json_schema_input_type=int | str)]


# --------------------------------------------------------------------------- runtime env


def _is_none(value: object) -> bool:
    return value is None


# A runtime_env is a sparse mapping: an absent key and a null one mean the same, so nulls are
# never written out and an empty environment dumps as ``{}`` (Ray's default).
_OMIT_NONE: Any = Field(default=None, exclude_if=_is_none)


class RuntimeEnv(RestModel):
    """The environment a replica runs in (Ray's ``runtime_env``).

    Validated: ``working_dir`` and ``py_modules`` hold remote URIs only (a local path would name
    a file on the server); ``env_vars`` maps strings to strings; ``pip`` and ``uv`` have one of
    Ray's shapes (:mod:`kubeserve.schema.packages`) and exclude each other and ``conda``. Passed
    through unvalidated, because Ray configs use them and a backend may honour them: ``conda``,
    ``container``, ``image_uri``, ``py_executable``, ``excludes``, ``config``,
    ``worker_process_setup_hook``, ``java_jars``, ``nsight``. Any other key is rejected, as
    everywhere else in the API.
    """

    working_dir: RemoteURI | None = _OMIT_NONE
    py_modules: list[RemoteURI] | None = _OMIT_NONE
    env_vars: EnvVars | None = _OMIT_NONE
    pip: Annotated[Any, AfterValidator(partial(validate_packages, "pip"))] = _OMIT_NONE
    uv: Annotated[Any, AfterValidator(partial(validate_packages, "uv"))] = _OMIT_NONE
    conda: Any = _OMIT_NONE
    container: Any = _OMIT_NONE
    image_uri: Any = _OMIT_NONE
    py_executable: Any = _OMIT_NONE
    excludes: Any = _OMIT_NONE
    config: Any = _OMIT_NONE
    worker_process_setup_hook: Any = _OMIT_NONE
    java_jars: Any = _OMIT_NONE
    nsight: Any = _OMIT_NONE

    @model_validator(mode="after")
    def _one_package_manager(self) -> Self:
        given = [key for key in ("pip", "uv", "conda") if getattr(self, key) is not None]
        if len(given) > 1:
            raise field_error(f"{' and '.join(given)} exclude each other", given[-1])
        return self


class ControllerRuntimeEnv(RestModel):
    """Ray 2.60 accepts only ``env_vars`` for the controller: the rest would change its code."""

    env_vars: EnvVars | None = None


def _whole_above_one(value: float) -> float:
    """A GPU count is a share of one device or whole devices (Ray: "resource quantities >1 must
    be whole numbers")."""
    if value > 1 and not float(value).is_integer():
        raise PydanticCustomError(
            "whole_gpus",
            "num_gpus above 1 must be a whole number (a fraction is a share of one GPU): {value}",
            {"value": value},
        )
    return value


def _label_selector(value: dict[str, str] | None) -> dict[str, str] | None:
    """Ray 2.60's ``label_selector``: each value a condition on a node label
    (:mod:`kubeserve.schema.node_labels`)."""
    try:
        node_labels.parse_selector(value)
    except ValueError as exc:
        raise PydanticCustomError("label_selector", "{reason}", {"reason": str(exc)}) from None
    return value


def _custom_resources(value: dict[str, float]) -> dict[str, float]:
    """Ray 2.60's check of ``resources``: CPUs, GPUs and memory have keywords of their own."""
    if "CPU" in value or "GPU" in value:
        raise PydanticCustomError(
            "resources_cpu_gpu",
            "Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU' in "
            "'resources' keyword",
        )
    if "memory" in value or "object_store_memory" in value:
        raise PydanticCustomError(
            "resources_memory",
            "The resources dictionary must not contain the key 'memory' or 'object_store_memory'",
        )
    return value


class RayActorOptionsSchema(RestModel):
    """Per-replica process options (``cluster_actor_options``, Ray's ``ray_actor_options``).

    ``object_store_memory`` is no longer in Ray 2.60 but older configs carry it; it is accepted and
    has no effect on scheduling. ``label_selector`` and ``fallback_strategy`` are Ray 2.60
    additions.
    """

    runtime_env: RuntimeEnv = Field(default_factory=RuntimeEnv)
    num_cpus: NonNegativeFloat | None = None
    num_gpus: Annotated[NonNegativeFloat, AfterValidator(_whole_above_one)] | None = None
    memory: NonNegativeFloat | None = None
    object_store_memory: NonNegativeFloat | None = None
    resources: Annotated[dict[str, NonNegativeFloat], AfterValidator(_custom_resources)] = Field(
        default_factory=dict
    )
    accelerator_type: str | None = None
    label_selector: Annotated[dict[str, str], AfterValidator(_label_selector)] | None = None
    fallback_strategy: list[dict[str, Any]] | None = None


# --------------------------------------------------------------------------- deployment parts


#: Ray 2.60's default policy, by the name Ray writes out.
DEFAULT_POLICY_FUNCTION = "ray.serve.autoscaling_policy:default_autoscaling_policy"
_DEFAULT_POLICY_NAMES = frozenset(
    {DEFAULT_POLICY_FUNCTION, "ray.serve.autoscaling_policy.default_autoscaling_policy"}
)


def policy_function_name(value: Any) -> str:
    """How a policy given as a callable is named in configs and status: ``module.qualname``, the
    name Ray 2.60 gives it (``AutoscalingPolicy.serialize_policy``); a string as it is."""
    if isinstance(value, str):
        return value
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"


def is_default_policy(policy: Any) -> bool:
    """Whether an ``autoscaling_config.policy`` (a mapping or a model, or None) asks for Ray's
    default policy, which kubeserve's autoscaler runs itself."""
    if policy is None:
        return True
    function = policy.get("policy_function") if isinstance(policy, dict) else policy.policy_function
    return function is None or policy_function_name(function) in _DEFAULT_POLICY_NAMES


def _policy_function(value: object) -> Any:
    # A config holds an import path; code (the decorator, serve.run) may give the function or
    # class itself, as Ray 2.60 accepts. A callable travels by the name describing it gets
    # (:func:`policy_function_name`) plus the application's code, where the policy process finds it.
    if callable(value) and not isinstance(value, str):
        return value
    if isinstance(value, str):
        return _check_import_path(value)
    raise PydanticCustomError(
        "policy_function", "policy_function must be an import path 'module:function' or a callable"
    )


def _json_serializable(value: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise PydanticCustomError(
            "policy_kwargs", "policy_kwargs is not JSON-serializable: {error}", {"error": str(exc)}
        ) from None
    return value


class AutoscalingPolicy(RestModel):
    """Which policy decides the replica count (Ray 2.60; default: Ray's default policy).

    ``policy_function`` is an import path (``module:function``), or in code the function or
    class itself; a class is constructed once with ``policy_kwargs`` and called on every decision,
    a function is called as it is (Ray ignores ``policy_kwargs`` then). kubeserve calls a custom
    policy in a process of the application's own environment
    (:mod:`kubeserve.runtime.autoscaling_policy`), never in the controller.
    """

    policy_function: Annotated[
        Any,
        PlainValidator(_policy_function, json_schema_input_type=ImportPath),
        PlainSerializer(policy_function_name, return_type=str, when_used="json"),
    ] = DEFAULT_POLICY_FUNCTION
    policy_kwargs: Annotated[dict[str, Any], AfterValidator(_json_serializable)] = Field(
        default_factory=dict
    )


class AutoscalingConfig(RestModel):
    """Ray 2.60's autoscaling parameters with Ray's defaults.

    Invariant checked: ``min_replicas <= initial_replicas <= max_replicas`` (initial when given).
    The deprecated smoothing fields are accepted for compatibility with older configs.
    """

    min_replicas: ReplicaCount = 1
    initial_replicas: ReplicaCount | None = None
    max_replicas: Annotated[ReplicaCount, Field(ge=1)] = 1
    target_ongoing_requests: PositiveFloat | None = 2
    metrics_interval_s: Period = 10.0
    look_back_period_s: PositiveFloat = 30.0
    smoothing_factor: PositiveFloat = 1.0
    upscale_smoothing_factor: PositiveFloat | None = None
    downscale_smoothing_factor: PositiveFloat | None = None
    upscaling_factor: PositiveFloat | None = None
    downscaling_factor: PositiveFloat | None = None
    downscale_delay_s: NonNegativeFloat = 600.0
    downscale_to_zero_delay_s: NonNegativeFloat | None = None
    upscale_delay_s: NonNegativeFloat = 30.0
    aggregation_function: Literal["mean", "max", "min"] = "mean"
    policy: AutoscalingPolicy = Field(default_factory=AutoscalingPolicy)

    # Ray's accessors, which policies written for Ray call on ``ctx.config``.
    def get_target_ongoing_requests(self) -> float:
        return float(self.target_ongoing_requests or 2)

    def get_upscaling_factor(self) -> float:
        return float(
            self.upscaling_factor or self.upscale_smoothing_factor or self.smoothing_factor
        )

    def get_downscaling_factor(self) -> float:
        return float(
            self.downscaling_factor or self.downscale_smoothing_factor or self.smoothing_factor
        )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise field_error(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})",
                "max_replicas",
            )
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise field_error(
                f"initial_replicas ({initial}) must be between min_replicas "
                f"({self.min_replicas}) and max_replicas ({self.max_replicas})",
                "initial_replicas",
            )
        return self


class BackpressureConfig(RestModel):
    """HTTP answer when ``max_queued_requests`` is exceeded (Ray 2.60): 503 or 429."""

    status_code: Literal[503, 429] = 503
    retry_after_s: NonNegativeFloat | None = None


class LoggingConfig(RestModel):
    """Ray's LoggingConfig: log encoding, level, directory and access-log switch."""

    encoding: Literal["TEXT", "JSON"] = "TEXT"
    log_level: LogLevel = "INFO"
    logs_dir: str | None = None
    enable_access_log: bool = True
    additional_log_standard_attrs: list[str] = Field(default_factory=list)


def _class_to_path(value: object) -> object:
    """A class given in code (Ray accepts the class itself) becomes its import path."""
    if isinstance(value, type):
        return f"{value.__module__}:{value.__qualname__}"
    return value


class RequestRouterConfig(RestModel):
    """How callers pick a replica (Ray 2.60): kubeserve's built-in power of two choices, or a
    subclass of ``ray.serve.request_router.RequestRouter`` (see
    :mod:`kubeserve.runtime.custom_router`), which the timing fields drive."""

    request_router_class: Annotated[ImportPath, BeforeValidator(_class_to_path)] = (
        "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
    )
    request_router_kwargs: dict[str, Any] = Field(default_factory=dict)
    request_routing_stats_period_s: PositiveFloat = 10
    request_routing_stats_timeout_s: PositiveFloat = 30
    initial_backoff_s: PositiveFloat = 0.025
    backoff_multiplier: PositiveFloat = 2
    max_backoff_s: PositiveFloat = 0.5


class GangSchedulingConfig(RestModel):
    """Replicas scheduled in groups of ``gang_size`` (Ray 2.60, alpha)."""

    gang_size: PositiveInt
    gang_placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    runtime_failure_policy: Literal["RESTART_GANG", "RESTART_REPLICA"] = "RESTART_GANG"


class DeploymentActorConfig(RestModel):
    """A long-lived helper process shared by a deployment's replicas (Ray 2.60, alpha)."""

    name: Name = Field(min_length=1)
    actor_class: ImportPath
    init_args: list[Any] = Field(default_factory=list)
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    actor_options: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- deployment

# Two spellings of one setting: (canonical Ray name, spec name).
_SYNONYMS = (
    ("max_ongoing_requests", "max_concurrent_queries"),
    ("ray_actor_options", "cluster_actor_options"),
)
# "A default is used when null": a null here means "not overridden".
_NULL_MEANS_NOT_GIVEN = frozenset(
    {
        "max_ongoing_requests",
        "max_concurrent_queries",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
        "health_check_period_s",
        "health_check_timeout_s",
        # Not nullable in Ray, whose client must parse what we echo back.
        "ray_actor_options",
        "cluster_actor_options",
    }
)


def _check_max_queued(value: int | None) -> int | None:
    if value is not None and value != -1 and value <= 0:
        raise PydanticCustomError(
            "max_queued_requests", "max_queued_requests must be -1 (no limit) or greater than 0"
        )
    return value


class DeploymentSchema(RestModel):
    """Options of one deployment that override the options set in code.

    Every field but ``name`` is optional and defaults to ``None``; which fields were given is
    ``model_fields_set``. The same model carries a deployment's *effective* config in
    ``DeploymentDetails.deployment_config``, where the controller sets every field it reports.

    Rules: ``num_replicas`` > 0, ``"auto"`` or null, and an integer ``num_replicas`` together
    with an ``autoscaling_config`` is an error (as in Ray); each synonym pair may be given in one
    spelling only.
    """

    name: Name = Field(min_length=1)
    num_replicas: NumReplicas = None
    max_ongoing_requests: PositiveInt | None = Field(
        default=None,
        validation_alias=AliasChoices("max_ongoing_requests", "max_concurrent_queries"),
    )
    max_queued_requests: Annotated[int | None, AfterValidator(_check_max_queued)] = None
    backpressure_config: BackpressureConfig | None = None
    user_config: dict[str, Any] | None = None
    autoscaling_config: AutoscalingConfig | None = None
    graceful_shutdown_wait_loop_s: Period | None = None
    graceful_shutdown_timeout_s: NonNegativeFloat | None = None
    health_check_period_s: Period | None = None
    health_check_timeout_s: Period | None = None
    ray_actor_options: RayActorOptionsSchema | None = Field(
        default=None,
        validation_alias=AliasChoices("ray_actor_options", "cluster_actor_options"),
    )
    placement_group_bundles: list[dict[str, NonNegativeFloat]] | None = None
    placement_group_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = (
        None
    )
    placement_group_bundle_label_selector: list[dict[str, str]] | None = None
    max_replicas_per_node: Annotated[int, Field(ge=1, le=100)] | None = None
    logging_config: LoggingConfig | None = None
    request_router_config: RequestRouterConfig | None = None
    gang_scheduling_config: GangSchedulingConfig | None = None
    deployment_actors: list[DeploymentActorConfig] | None = None
    rolling_update_percentage: Annotated[float, Field(gt=0, le=1)] | None = None
    max_surge_percent: Annotated[int, Field(ge=0, le=100)] | None = None
    route_prefix: RoutePrefix | None = None
    is_driver_deployment: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_spelling_and_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for canonical, spec_name in _SYNONYMS:
            if canonical in data and spec_name in data:
                raise field_error(
                    f"{spec_name} and {canonical} are the same setting; give only one",
                    spec_name,
                )
        return {k: v for k, v in data.items() if not (v is None and k in _NULL_MEANS_NOT_GIVEN)}

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> DeploymentSchema:
        if isinstance(self.num_replicas, int) and self.autoscaling_config is not None:
            raise field_error(
                "num_replicas cannot be set together with autoscaling_config; remove it, or "
                "set it to 'auto' or null",
                "num_replicas",
            )
        return self


# --------------------------------------------------------------------------- application


class ServeApplicationSchema(RestModel):
    """One application: the single-application PUT body and GET answer.

    ``name`` defaults to ``""`` as the single-application body documents; inside a
    multi-application config the element type is :class:`ServeApplicationEntry`, whose name
    defaults to Ray's ``"default"``.
    """

    name: Name = ""
    route_prefix: RoutePrefix | None = "/"
    import_path: ImportPath
    runtime_env: RuntimeEnv = Field(default_factory=RuntimeEnv)
    host: str = "0.0.0.0"
    port: Port = 8000
    deployments: list[DeploymentSchema] = Field(
        default_factory=list, max_length=MAX_DEPLOYMENTS_PER_APPLICATION
    )
    args: dict[str, Any] = Field(default_factory=dict)
    logging_config: LoggingConfig | None = None
    external_scaler_enabled: bool = False
    autoscaling_policy: AutoscalingPolicy | None = None

    @model_validator(mode="after")
    def _deployments_consistent(self) -> ServeApplicationSchema:
        seen: set[str] = set()
        for i, dep in enumerate(self.deployments):
            if dep.name in seen:
                raise field_error(
                    f"deployment name {dep.name!r} appears more than once", "deployments", i, "name"
                )
            seen.add(dep.name)
            if self.external_scaler_enabled and (
                dep.autoscaling_config is not None or dep.num_replicas == "auto"
            ):
                field = "autoscaling_config" if dep.autoscaling_config else "num_replicas"
                raise field_error(
                    "built-in autoscaling cannot be used when external_scaler_enabled is true",
                    "deployments",
                    i,
                    field,
                )
        return self


class ServeApplicationEntry(ServeApplicationSchema):
    """An element of ``applications`` in the multi-application config; Ray's default name."""

    ray_name: ClassVar[str] = "ServeApplicationSchema"

    name: Name = "default"


# --------------------------------------------------------------------------- serving layer


class ProxyLocation(StrEnum):
    """Where HTTP proxies run (Ray 2.60)."""

    DISABLED = "Disabled"
    HEAD_ONLY = "HeadOnly"
    EVERY_NODE = "EveryNode"


class DataPath(StrEnum):
    """What serves the proxies' HTTP requests: the Python proxy alone, or the native data path
    (``kubeserve-fastpath``, :mod:`kubeserve.runtime.fastpath`) in front of it, which hands what
    it does not cover to the Python proxy (and terminates the proxy's TLS, when it serves HTTPS)."""

    PYTHON = "python"
    NATIVE = "native"


#: The data path of ``kubeserve start`` and of a ServeInstance that does not choose one (the
#: operator's ``--proxy-data-path``, the chart's ``proxyDataPath``); ``kubeserve proxy`` spells the
#: same default itself (no pydantic there). Where the binary is missing, a defaulted native path
#: serves on the Python one, saying so (:func:`kubeserve.runtime.fastpath.choose_data_path`).
DEFAULT_DATA_PATH = DataPath.NATIVE


class HTTPOptionsSchema(RestModel):
    """HTTP proxy options; like host/port, fixed once the serving layer runs."""

    host: str = "0.0.0.0"
    port: Port = 8000
    root_path: str = ""
    request_timeout_s: PositiveFloat | None = None
    keep_alive_timeout_s: PositiveInt = 90
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile_password: str | None = None
    ssl_ca_certs: str | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> HTTPOptionsSchema:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            missing = "ssl_certfile" if self.ssl_certfile is None else "ssl_keyfile"
            raise field_error("ssl_keyfile and ssl_certfile must be given together", missing)
        if self.root_path and not self.root_path.startswith("/"):
            raise field_error("root_path must be empty or start with '/'", "root_path")
        return self


class GRPCOptionsSchema(RestModel):
    """gRPC proxy options (Ray's ``gRPCOptionsSchema``); no servicers means no gRPC server."""

    ray_name: ClassVar[str] = "gRPCOptionsSchema"

    port: Port = 9000
    grpc_servicer_functions: list[ImportPath] = Field(default_factory=list)
    request_timeout_s: PositiveFloat | None = None
    enable_reflection: bool = True


def _check_exporter_path(value: str) -> str:
    """Empty (the default exporter) or an import path."""
    return _check_import_path(value) if value else value


class TracingConfig(RestModel):
    """Distributed tracing (Ray 2.60, alpha): OpenTelemetry spans from proxies and replicas.
    Ray reads its defaults from the environment; kubeserve's are Ray's with it empty."""

    enabled: bool = False
    #: a function taking no arguments that returns span processors (or exporters)
    exporter_import_path: Annotated[str, AfterValidator(_check_exporter_path)] = ""
    sampling_ratio: Annotated[float, Field(ge=0, le=1)] = 0.01


class ControllerOptions(RestModel):
    """Options of the controller process, applied only when it is first started."""

    runtime_env: ControllerRuntimeEnv | None = None


class ServeDeploySchema(RestModel):
    """The multi-application PUT body (Ray's ``ServeDeploySchema``).

    Rules beyond field types: application names are non-empty and unique; route prefixes are
    unique across applications (null prefixes, meaning no HTTP route, never conflict). An
    application's ``host``/``port`` are a single-application notion; in a multi-application config
    the proxies listen where ``http_options`` says, so an application may repeat those values but
    giving different ones is an error at that application's field rather than silently ignored.
    """

    proxy_location: ProxyLocation = ProxyLocation.EVERY_NODE
    http_options: HTTPOptionsSchema = Field(default_factory=HTTPOptionsSchema)
    grpc_options: GRPCOptionsSchema = Field(default_factory=GRPCOptionsSchema)
    controller_options: ControllerOptions | None = None
    logging_config: LoggingConfig | None = None
    tracing_config: TracingConfig | None = None
    target_capacity: Annotated[float, Field(ge=0, le=100)] | None = None
    applications: list[ServeApplicationEntry] = Field(max_length=MAX_APPLICATIONS)

    @model_validator(mode="after")
    def _applications_consistent(self) -> ServeDeploySchema:
        names: set[str] = set()
        prefixes: dict[str, str] = {}
        for i, app in enumerate(self.applications):
            if not app.name:
                raise field_error("application name must not be empty", "applications", i, "name")
            if app.name in names:
                raise field_error(
                    f"application name {app.name!r} appears more than once",
                    "applications",
                    i,
                    "name",
                )
            names.add(app.name)
            if app.route_prefix is not None:
                if app.route_prefix in prefixes:
                    raise field_error(
                        f"route prefix {app.route_prefix!r} is already used by application "
                        f"{prefixes[app.route_prefix]!r}",
                        "applications",
                        i,
                        "route_prefix",
                    )
                prefixes[app.route_prefix] = app.name
            for field in ("host", "port"):
                given = getattr(app, field)
                wanted = getattr(self.http_options, field)
                if field in app.model_fields_set and given != wanted:
                    raise field_error(
                        f"{field} {given!r} differs from http_options.{field} {wanted!r}; in a "
                        f"multi-application config set it in http_options",
                        "applications",
                        i,
                        field,
                    )
        return self
