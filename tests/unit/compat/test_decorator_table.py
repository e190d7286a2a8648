"""The decorator and a config give one answer for every deployment field of kubeserve's table of
decisions (:data:`kubeserve.schema.support.SUPPORT`): walked here field by field, nested models
included, so a new entry cannot make them disagree."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

from kubeserve.schema.body import parse_body
from kubeserve.schema.config import DeploymentSchema, ServeDeploySchema
from kubeserve.schema.errors import SchemaError
from kubeserve.schema.support import SUPPORT
from kubeserve.sdk.deployment import deployment
from kubeserve.sdk.errors import UnsupportedOptionError

#: Values tried for a refused field, first to last, until the config refuses one.
CANDIDATES: list[Any] = [
    True,
    1,
    0.5,
    "x",
    "PACK",
    ["x"],
    {"x": "y"},
    {"gang_size": 2},
    [{"CPU": 1.0}],
    [{"name": "a", "actor_class": "m:C"}],
    "my.module:Router",
]


def _paths() -> dict[str, tuple[str, ...]]:
    """``Model.field`` -> where that field is, from a deployment entry's top level."""
    paths: dict[str, tuple[str, ...]] = {}
    todo: list[tuple[type[BaseModel], tuple[str, ...]]] = [(DeploymentSchema, ())]
    while todo:
        model, prefix = todo.pop(0)
        name = getattr(model, "ray_name", "") or model.__name__
        for field, info in model.model_fields.items():
            key = f"{name}.{field}"
            if key in paths:
                continue
            paths[key] = (*prefix, field)
            for nested in _models(info.annotation):
                todo.append((nested, (*prefix, field)))
    return paths


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


PATHS = _paths()
LISTS = {"deployment_actors"}  # a list of models: the field sits in its first element


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for part in reversed(path[1:]):
        value = {part: value}
    top = path[0]
    if top in LISTS and len(path) > 1:
        return {top: [{"name": "a", "actor_class": "m:C", **value}]}
    return {top: value}


def _config_refusal(option: dict[str, Any]) -> str | None:
    body = {"applications": [{"import_path": "a:b", "deployments": [{"name": "D", **option}]}]}
    try:
        parse_body(ServeDeploySchema, body)
    except SchemaError as err:
        refused = [d["msg"] for d in err.details if "is not supported by kubeserve" in d["msg"]]
        return refused[0] if refused else ""
    return None


def _code_refusal(option: dict[str, Any]) -> str | None:
    try:
        deployment(**option)(len)  # type: ignore[call-overload]
    except UnsupportedOptionError as err:
        return str(err)
    except (TypeError, ValueError):
        return ""
    return None


#: Where code and configs knowingly differ, and why.
KNOWN_DIFFERENCES = {
    # Ray 1's per-deployment route (removed in Ray 2): a config refuses it; the decorator still
    # records it for code written for Ray 1, which sets the application's route from it.
    "DeploymentSchema.route_prefix": "Ray 1 code sets the application's route with it",
}
REFUSED = sorted(
    k
    for k in PATHS
    if k in SUPPORT and SUPPORT[k].status == "refused" and k not in KNOWN_DIFFERENCES
)
#: The fields inside the config models an option holds (the decorator's scalar options are
#: checked by its own stricter rules: ``True`` is no replica count in code, as in Ray's).
NESTED = sorted(k for k in PATHS if k in SUPPORT and len(PATHS[k]) > 1)
DECIDED = sorted(k for k in PATHS if k in SUPPORT)


def test_every_deployment_field_of_the_table_is_reached() -> None:
    assert "AutoscalingPolicy.policy_function" in PATHS
    assert "RuntimeEnv.pip" in PATHS
    assert len(DECIDED) == len(PATHS), sorted(set(PATHS) - set(SUPPORT))


@pytest.mark.parametrize("key", REFUSED)
def test_code_refuses_what_a_config_refuses_in_the_same_words(key: str) -> None:
    for candidate in CANDIDATES:
        option = _nest(PATHS[key], candidate)
        in_config = _config_refusal(option)
        if in_config:
            assert SUPPORT[key].note in in_config
            in_code = _code_refusal(option)
            assert in_code is not None and SUPPORT[key].note in in_code, (option, in_code)
            return
    pytest.fail(f"no candidate value is refused for {key}: add one to CANDIDATES")


@pytest.mark.parametrize("key", NESTED)
def test_code_accepts_what_a_config_accepts(key: str) -> None:
    """Every value a config accepts inside a config model, code accepts too."""
    model_path = PATHS[key]
    for candidate in CANDIDATES:
        option = _nest(model_path, candidate)
        if _config_refusal(option) is None:
            assert _code_refusal(option) is None, option
