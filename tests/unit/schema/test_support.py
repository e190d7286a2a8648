"""Every field of Ray 2.60's config schema has a decision, and refused ones are 400s naming why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kubeserve.schema.body import parse_body
from kubeserve.schema.config import RuntimeEnv, ServeDeploySchema
from kubeserve.schema.errors import SchemaError
from kubeserve.schema.support import DECORATOR, SUPPORT, markdown_table
from kubeserve.sdk.deployment import DeploymentOptions

ROOT = Path(__file__).resolve().parents[3]
RAY_SCHEMA = json.loads((ROOT / "tests/reference/ray-2.60/ServeDeploySchema.json").read_text())


def ray_fields() -> set[str]:
    """``Model.field`` for every property of Ray's schema and of the models it contains."""
    found = {f"ServeDeploySchema.{name}" for name in RAY_SCHEMA["properties"]}
    for model, definition in RAY_SCHEMA["$defs"].items():
        found |= {f"{model}.{name}" for name in definition.get("properties", {})}
    return found


def kubeserve_fields() -> set[str]:
    """The same for kubeserve's own models (Ray's names), nested models included."""
    found: set[str] = set()
    todo: list[type[BaseModel]] = [ServeDeploySchema]
    seen: set[type[BaseModel]] = set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        name = getattr(model, "ray_name", "") or model.__name__
        for field, info in model.model_fields.items():
            found.add(f"{name}.{field}")
            todo.extend(_models_in(info.annotation))
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def test_every_field_of_rays_schema_has_a_decision() -> None:
    missing = sorted(ray_fields() - set(SUPPORT))
    assert not missing, f"decide what kubeserve does with: {missing}"


def test_every_field_kubeserve_accepts_has_a_decision_and_no_decision_is_stale() -> None:
    accepted = kubeserve_fields()
    decorator = {f"{DECORATOR}.{option}" for option in DeploymentOptions.__annotations__}
    assert not sorted(accepted - set(SUPPORT))
    assert not sorted(set(SUPPORT) - accepted - ray_fields() - decorator)
    assert {f"RuntimeEnv.{f}" for f in RuntimeEnv.model_fields} <= set(SUPPORT)


def test_the_readme_table_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, "regenerate: python -m kubeserve.schema.support"


REFUSED = {
    "logging_config.logs_dir": {"logging_config": {"logs_dir": "/var/log/serve"}},
    "controller_options.runtime_env": {"controller_options": {"runtime_env": {"env_vars": {}}}},
}


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_a_refused_value_is_a_400_at_its_path_with_the_reason(path: str) -> None:
    with pytest.raises(SchemaError) as err:
        parse_body(ServeDeploySchema, {"applications": [], **REFUSED[path]})
    ((detail),) = err.value.details
    assert ".".join(str(p) for p in detail["loc"]) == path
    assert "is not supported by kubeserve: " in detail["msg"]


def test_values_that_ask_for_nothing_are_accepted() -> None:
    """What ``serve build`` writes out for an application that uses none of these features."""
    body = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000, "root_path": ""},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
        "logging_config": {
            "encoding": "TEXT",
            "log_level": "INFO",
            "logs_dir": None,
            "enable_access_log": True,
            "additional_log_standard_attrs": [],
        },
        "applications": [
            {
                "name": "app",
                "import_path": "a:b",
                "deployments": [
                    {
                        "name": "d",
                        "placement_group_bundles": None,
                        "max_replicas_per_node": None,
                        "request_router_config": {
                            "request_router_class": "ray.serve._private.request_router:"
                            "PowerOfTwoChoicesRequestRouter",
                            "request_router_kwargs": {},
                        },
                        "deployment_actors": [],
                    }
                ],
            }
        ],
    }
    assert parse_body(ServeDeploySchema, body).as_given() == body
