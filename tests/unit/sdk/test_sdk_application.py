"""Binding deployments into a graph and walking it."""

# mypy keeps the class type under a class decorator (python/mypy#3135), so it cannot see that
# @deployment turned the class into a Deployment with .bind() and .options().
# mypy: disable-error-code="attr-defined"

from __future__ import annotations

from typing import Any

import pytest

from kubeserve import Application, GraphError, deployment


@deployment
class Ingress:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


@deployment
class Model:
    def __init__(self, *args: Any) -> None:
        pass


@deployment
def preprocess(x: Any) -> Any:
    return x


def test_bind_returns_an_application_node() -> None:
    node = Model.bind(1, k="v")
    assert isinstance(node, Application)
    assert (node.name, node.args, node.kwargs) == ("Model", (1,), {"k": "v"})
    assert node.deployments() == [("Model", Model, (1,), {"k": "v"})]


def test_graph_walk_ingress_first_then_depth_first_in_argument_order() -> None:
    model = Model.bind(3)
    pre = preprocess.bind()
    other = Model.options(name="Other").bind(model)
    app = Ingress.bind([pre, {"m": model}], extra=(other,))
    names = [name for name, *_ in app.deployments()]
    assert names == ["Ingress", "preprocess", "Model", "Other"]
    assert [child.name for child in app.children()] == ["preprocess", "Model", "Other"]
    name, dep, args, kwargs = app.deployments()[3]
    assert (name, dep.name, args, kwargs) == ("Other", "Other", (model,), {})


def test_the_same_node_reused_is_one_deployment() -> None:
    model = Model.bind()
    app = Ingress.bind(model, model, nested=[model])
    assert [name for name, *_ in app.deployments()] == ["Ingress", "Model"]
    assert len(app.children()) == 1


def test_two_different_nodes_with_one_name_are_an_error() -> None:
    app = Ingress.bind(Model.bind(1), Model.bind(2))
    with pytest.raises(GraphError, match="two different deployments are named 'Model'"):
        app.deployments()
    renamed = Ingress.bind(Model.bind(1), Model.options(name="Model2").bind(2))
    assert [name for name, *_ in renamed.deployments()] == ["Ingress", "Model", "Model2"]
