"""The body of serve.run's PUT: the graph's encoding and size limit, the name from the path."""

from __future__ import annotations

import base64
import hashlib

import pytest
from pydantic import ValidationError

from kubeserve.schema.body import parse_body
from kubeserve.schema.errors import SchemaError
from kubeserve.schema.imperative import (
    GRAPH_DIGEST_KEY,
    GraphTooLargeError,
    ImperativeApplicationSchema,
    check_application_name,
)
from kubeserve.schema.limits import MAX_PICKLED_GRAPH_BYTES
from kubeserve.schema.resources import ServeApplicationSpec


def _body(graph: bytes, **fields: object) -> ImperativeApplicationSchema:
    return parse_body(
        ImperativeApplicationSchema, {"graph": base64.b64encode(graph).decode(), **fields}
    )


def test_the_stored_config_holds_the_digest_and_never_the_graph() -> None:
    body = _body(b"pickled", route_prefix="/x")
    config = body.stored_config("app", body.graph_bytes())
    assert config == {
        "name": "app",
        "route_prefix": "/x",
        GRAPH_DIGEST_KEY: hashlib.sha256(b"pickled").hexdigest(),
    }
    assert _body(b"pickled").stored_config("app", b"pickled")["route_prefix"] == "/"


def test_a_graph_over_the_limit_names_it() -> None:
    with pytest.raises(GraphTooLargeError, match=f"limit of {MAX_PICKLED_GRAPH_BYTES} bytes"):
        _body(b"x" * (MAX_PICKLED_GRAPH_BYTES + 1)).graph_bytes()
    assert len(_body(b"x" * MAX_PICKLED_GRAPH_BYTES).graph_bytes()) == MAX_PICKLED_GRAPH_BYTES


@pytest.mark.parametrize("graph", ["not base64!", ""])
def test_a_graph_that_is_not_base64_is_a_400_at_graph(graph: str) -> None:
    with pytest.raises(SchemaError) as caught:
        parse_body(ImperativeApplicationSchema, {"graph": graph}).graph_bytes()
    assert caught.value.details[0]["loc"] == ["graph"]


def test_other_fields_follow_the_config_rules() -> None:
    with pytest.raises(SchemaError) as caught:
        _body(b"g", route_prefix="no-slash")
    assert caught.value.details[0]["loc"] == ["route_prefix"]
    with pytest.raises(SchemaError):
        _body(b"g", import_path="a:b")  # unknown field


@pytest.mark.parametrize("name", ["", "a/b", "../x", "x" * 101])
def test_a_bad_name_in_the_path_is_a_400_at_name(name: str) -> None:
    with pytest.raises(SchemaError) as caught:
        check_application_name(name)
    assert caught.value.details[0]["loc"] == ["name"]
    assert check_application_name("My App.v2") == "My App.v2"


# --------------------------------------------------------------------------- as a custom resource


def test_a_serve_run_config_round_trips_through_the_application_spec() -> None:
    body = _body(b"pickled", route_prefix="/x", logging_config={"log_level": "DEBUG"})
    config = body.stored_config("My App", body.graph_bytes())
    spec = ServeApplicationSpec.from_imperative(config)
    assert spec.imperative
    assert spec.model_dump(exclude_unset=True) == {
        "appName": "My App",
        "routePrefix": "/x",
        "loggingConfig": {"logLevel": "DEBUG"},
        "pickledGraph": {"sha256": config[GRAPH_DIGEST_KEY]},
    }
    assert spec.app_config(name="My App") == config
    declarative = ServeApplicationSpec.model_validate({"importPath": "m:app"})
    assert not declarative.imperative
    assert declarative.app_config(name="a") == {"name": "a", "import_path": "m:app"}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"importPath": "m:app", "pickledGraph": {"sha256": "a" * 64}},
        {"pickledGraph": {"sha256": "a" * 64}, "runtimeEnv": {"env_vars": {"A": "1"}}},
        {"pickledGraph": {"sha256": "a" * 64}, "deployments": [{"name": "D"}]},
        {"pickledGraph": {"sha256": "not hex"}},
    ],
)
def test_an_application_spec_holds_an_import_path_or_a_graph(spec: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ServeApplicationSpec.model_validate(spec)
