"""``@deployment`` and :class:`Deployment`: a user class or function plus the options set in code.

A :class:`Deployment` records only the options the user wrote in code. Defaults and the config's
overrides are merged later by the controller (code defaults <- config overrides), so the SDK must
not invent values: an option absent from :attr:`Deployment.code_options` means "not set in code".

Invariants:

* ``code_options`` keys are the REST (snake_case) names; ``max_concurrent_queries`` is stored as
  ``max_ongoing_requests``; ``name`` is kept apart in :attr:`Deployment.name`.
* An option passed as ``None`` means "use the default" and is not recorded, except ``route_prefix``,
  where ``None`` means "no HTTP route" and is therefore a real choice.
* Deployments are immutable: :meth:`Deployment.options` and :meth:`Deployment.bind` return new
  objects.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack, overload

from kubeserve.sdk.errors import UnsupportedOptionError

if TYPE_CHECKING:
    from kubeserve.sdk.application import Application


class DeploymentOptions(TypedDict, total=False):
    """Every option ``@deployment`` and ``.options()`` accept (all optional)."""

    name: str
    num_replicas: int | Literal["auto"] | None
    max_ongoing_requests: int | None
    max_concurrent_queries: int | None
    max_queued_requests: int | None
    user_config: Any
    autoscaling_config: dict[str, Any] | None
    health_check_period_s: float | None
    health_check_timeout_s: float | None
    graceful_shutdown_wait_loop_s: float | None
    graceful_shutdown_timeout_s: float | None
    ray_actor_options: dict[str, Any] | None
    route_prefix: str | None
    is_driver_deployment: bool | None
    logging_config: Any
    request_router_config: Any
    backpressure_config: Any
    version: str | None
    placement_group_bundles: list[dict[str, float]] | None
    placement_group_strategy: str | None
    placement_group_bundle_label_selector: list[dict[str, str]] | None
    max_replicas_per_node: int | None
    max_constructor_retry_count: int | None
    gang_scheduling_config: Any
    deployment_actors: Any
    rolling_update_percentage: float | None
    max_surge_percent: int | None


#: Option names as they appear in :attr:`Deployment.code_options` (and in the build description).
OPTION_NAMES: tuple[str, ...] = (
    "num_replicas",
    "max_ongoing_requests",
    "max_queued_requests",
    "user_config",
    "autoscaling_config",
    "health_check_period_s",
    "health_check_timeout_s",
    "graceful_shutdown_wait_loop_s",
    "graceful_shutdown_timeout_s",
    "ray_actor_options",
    "route_prefix",
    "is_driver_deployment",
    "logging_config",
    "request_router_config",
    "backpressure_config",
    "rolling_update_percentage",
    "max_surge_percent",
)
_ALIASES = {"max_concurrent_queries": "max_ongoing_requests"}
_KEEP_NONE = frozenset({"route_prefix"})
_NON_NEGATIVE = ("graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s")
_POSITIVE = ("health_check_period_s", "health_check_timeout_s")


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Check option names and simple value rules; return the recorded (canonical) options.

    Raises :class:`TypeError` for an unknown option and :class:`ValueError` for a value no config
    could accept, so that mistakes surface at import time with the user's line in the traceback.
    """
    recorded: dict[str, Any] = {}
    for key, value in options.items():
        canonical = _ALIASES.get(key, key)
        if canonical not in OPTION_NAMES and _decided(canonical):
            reason = _refusal(canonical, _plain(value))
            if reason is not None:
                raise UnsupportedOptionError(reason)
            continue  # None, or another value that asks for nothing
        if canonical not in OPTION_NAMES:
            known = ", ".join(sorted((*OPTION_NAMES, *_ALIASES, "name")))
            raise TypeError(f"unknown deployment option {key!r}; known options: {known}")
        if value is None and canonical not in _KEEP_NONE:
            continue
        value = _plain(value)
        if canonical in recorded and recorded[canonical] != value:
            raise ValueError(
                "max_ongoing_requests and max_concurrent_queries are the same option; "
                "give only one of them"
            )
        _check_value(canonical, value)
        recorded[canonical] = value
    return recorded


def _plain(value: Any) -> Any:
    """A pydantic model given as an option (Ray's ``AutoscalingConfig(...)``) as the dict of the
    fields it sets, the form configs use; nested too (``{"policy": AutoscalingPolicy(...)}``).
    A policy function given as a callable stays the callable: it travels with the application's
    code (see :func:`described_options`)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    dump = getattr(value, "model_dump", None)
    if not callable(dump) or isinstance(value, type):
        return value
    plain = dump(mode="json", exclude_unset=True)
    function = getattr(value, "policy_function", None)
    if callable(function) and "policy_function" in plain:
        plain["policy_function"] = function
    policy = getattr(value, "policy", None)
    if policy is not None and "policy" in plain:
        plain["policy"] = _plain(policy)
    return plain


def described_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as JSON can carry them: a policy function given as a callable is named the way
    Ray names it (``module.qualname``); the policy process finds it by that name in the
    application's code."""
    policy = (options.get("autoscaling_config") or {}).get("policy") or {}
    function = policy.get("policy_function")
    if not callable(function):
        return options
    from kubeserve.schema.config import policy_function_name

    named = {**policy, "policy_function": policy_function_name(function)}
    return {**options, "autoscaling_config": {**options["autoscaling_config"], "policy": named}}


#: Options whose value is one of the config's models: checked by the config's own model
#: (:class:`kubeserve.schema.config.DeploymentSchema`), so code and configs accept and refuse the
#: same values in the same words, nested fields included.
_CONFIG_MODELS = (
    "autoscaling_config",
    "ray_actor_options",
    "logging_config",
    "request_router_config",
    "backpressure_config",
)


def _check_value(name: str, value: Any) -> None:
    if name in _CONFIG_MODELS:
        _check_ray_config(name, value)
    elif name == "num_replicas":
        if value != "auto" and (not _is_int(value) or value < 1):
            raise ValueError(f"num_replicas must be a positive integer or 'auto', got {value!r}")
    elif name in ("max_ongoing_requests", "max_queued_requests"):
        if not _is_int(value) or (
            value < 1 and not (name == "max_queued_requests" and value == -1)
        ):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    elif name in _POSITIVE:
        if not _is_number(value) or value <= 0:
            raise ValueError(f"{name} must be a number greater than 0, got {value!r}")
    elif name in _NON_NEGATIVE:
        if not _is_number(value) or value < 0:
            raise ValueError(f"{name} must be a number of at least 0, got {value!r}")
    elif name == "rolling_update_percentage":
        if not _is_number(value) or not 0 < value <= 1:
            raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    elif name == "max_surge_percent":
        if not _is_int(value) or not 0 <= value <= 100:
            raise ValueError(f"{name} must be an integer from 0 to 100, got {value!r}")
    elif name == "route_prefix" and (
        value is not None and (not isinstance(value, str) or not value.startswith("/"))
    ):
        raise ValueError(f"route_prefix must be None or a path starting with '/', got {value!r}")


# The schema (pydantic and every config model) is imported only on the rare paths below, an
# option kubeserve does not honour or one of Ray's dict configs: a replica importing a module of
# plain ``@deployment`` classes stays free of it.


def _decided(option: str) -> bool:
    """The option is one kubeserve's table of Ray's fields decides about."""
    from kubeserve.schema import support

    return any(f"{model}.{option}" in support.SUPPORT for model in _table_models())


def _refusal(option: str, value: Any) -> str | None:
    """Why kubeserve refuses ``value`` for a decorator option it does not honour, as a config
    giving the same value is refused (:func:`kubeserve.schema.support.refusal`)."""
    from kubeserve.schema import support

    for model in _table_models():
        reason = support.refusal(model, option, value)
        if reason is not None:
            return reason
    return None


def _table_models() -> tuple[str, ...]:
    """Where the decorator's options are in :data:`kubeserve.schema.support.SUPPORT`."""
    from kubeserve.schema import support

    return ("DeploymentSchema", support.DECORATOR)


def _check_ray_config(name: str, value: Any) -> None:
    """An option holding one of Ray's config models, validated as the same field of a config's
    deployment entry: the same values are accepted and refused, with the same reasons."""
    from pydantic import ValidationError

    from kubeserve.schema.config import DeploymentSchema
    from kubeserve.schema.errors import FIELD_ERROR_TYPE, validation_details

    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict, got {type(value).__name__}")
    try:
        DeploymentSchema.model_validate({"name": "code", name: value})
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in detail['loc'])}: {detail['msg']}"
            for detail in validation_details(err)
        )
        refused = any(e["type"] == FIELD_ERROR_TYPE for e in err.errors())
        raise (UnsupportedOptionError if refused else ValueError)(problems) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Deployment:
    """A user class or function that kubeserve runs as a set of replicas.

    Build one with :func:`deployment`; derive variants with :meth:`options`; turn it into a node of
    an application graph with :meth:`bind`.
    """

    __slots__ = ("_code_options", "_name", "_target")

    def __init__(
        self, target: Callable[..., Any], name: str, code_options: dict[str, Any] | None = None
    ) -> None:
        if not callable(target):
            raise TypeError(f"@deployment needs a class or a function, got {type(target).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"deployment name must be a non-empty string, got {name!r}")
        self._target = target
        self._name = name
        self._code_options = dict(code_options or {})

    @property
    def name(self) -> str:
        return self._name

    @property
    def func_or_class(self) -> Callable[..., Any]:
        """The decorated class or function, unchanged."""
        return self._target

    @property
    def is_function(self) -> bool:
        """True for a function deployment (called once per request), False for a class."""
        return not inspect.isclass(self._target)

    @property
    def code_options(self) -> dict[str, Any]:
        """A copy of the options set in code, canonical REST names, ``name`` excluded."""
        return dict(self._code_options)

    def options(self, **options: Unpack[DeploymentOptions]) -> Deployment:
        """A new deployment with these options added to (or replacing) the ones set so far.

        ``name=`` renames the copy; the original keeps its name and options.
        """
        raw: dict[str, Any] = dict(options)
        name: str = raw.pop("name", self._name)
        merged = {**self._code_options, **normalize_options(raw)}
        for key, value in raw.items():
            if value is None and _ALIASES.get(key, key) not in _KEEP_NONE:
                merged.pop(_ALIASES.get(key, key), None)
        return Deployment(self._target, name, merged)

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        """A node of an application graph: this deployment with its constructor arguments.

        Bound applications nested in ``args``/``kwargs`` (also inside lists, tuples and dict values)
        become :class:`~kubeserve.sdk.handle.DeploymentHandle` objects when a replica is
        constructed.
        """
        from kubeserve.sdk.application import Application

        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"deployment {self._name!r} cannot be called or constructed directly; "
            "use .bind(...) to build an application and deploy it"
        )

    def __repr__(self) -> str:
        return f"Deployment(name={self._name!r}, options={self._code_options!r})"


_Target = Callable[..., Any]


@overload
def deployment(_target: _Target, /) -> Deployment: ...


@overload
def deployment(
    _target: None = None, /, **options: Unpack[DeploymentOptions]
) -> Callable[[_Target], Deployment]: ...


def deployment(
    _target: _Target | None = None, /, **options: Unpack[DeploymentOptions]
) -> Deployment | Callable[[_Target], Deployment]:
    """Declare a deployment: ``@deployment`` or ``@deployment(num_replicas=2, ...)``.

    The default name is the class's or function's ``__name__``. Options are checked here, so a typo
    fails at import time, but only the options given are remembered (see the module docstring).
    """
    raw: dict[str, Any] = dict(options)
    name: str | None = raw.pop("name", None)
    recorded = normalize_options(raw)

    def wrap(target: _Target) -> Deployment:
        if isinstance(target, Deployment):
            raise TypeError("@deployment applied twice; use .options(...) to change options")
        default_name: str = getattr(target, "__name__", "")
        return Deployment(target, name or default_name, recorded)

    if _target is not None:
        if options:
            raise TypeError("use either @deployment or @deployment(...), not both")
        return wrap(_target)
    return wrap
