"""@deployment and Deployment.options: only the options written in code are remembered."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import kubeserve
from kubeserve import Deployment, deployment


class Model:
    def __call__(self) -> str:
        return "ok"


def handler(request: Any) -> str:
    return "ok"


def test_bare_decorator_on_class_and_function() -> None:
    cls_dep = deployment(Model)
    fn_dep = deployment(handler)
    assert isinstance(cls_dep, Deployment)
    assert (cls_dep.name, cls_dep.is_function, cls_dep.code_options) == ("Model", False, {})
    assert (fn_dep.name, fn_dep.is_function, fn_dep.func_or_class) == ("handler", True, handler)


def test_options_set_in_code_are_the_only_ones_recorded() -> None:
    dep = deployment(
        num_replicas=2,
        max_concurrent_queries=10,
        user_config={"a": 1},
        autoscaling_config={"min_replicas": 1},
        health_check_period_s=3,
        health_check_timeout_s=7.5,
        graceful_shutdown_wait_loop_s=0,
        graceful_shutdown_timeout_s=5,
        ray_actor_options={"num_cpus": 1},
        route_prefix=None,
        is_driver_deployment=False,
        max_queued_requests=-1,
        name="Renamed",
    )(Model)
    assert dep.name == "Renamed"
    assert dep.code_options == {
        "num_replicas": 2,
        "max_ongoing_requests": 10,
        "user_config": {"a": 1},
        "autoscaling_config": {"min_replicas": 1},
        "health_check_period_s": 3,
        "health_check_timeout_s": 7.5,
        "graceful_shutdown_wait_loop_s": 0,
        "graceful_shutdown_timeout_s": 5,
        "ray_actor_options": {"num_cpus": 1},
        "route_prefix": None,
        "is_driver_deployment": False,
        "max_queued_requests": -1,
    }
    assert deployment(num_replicas="auto")(Model).code_options == {"num_replicas": "auto"}
    assert deployment(user_config=None, num_replicas=None)(Model).code_options == {}


def test_options_returns_a_new_deployment() -> None:
    base = deployment(num_replicas=2)(Model)
    derived = base.options(name="Other", max_ongoing_requests=3, num_replicas=None)
    assert (derived.name, derived.code_options) == ("Other", {"max_ongoing_requests": 3})
    assert (base.name, base.code_options) == ("Model", {"num_replicas": 2})
    assert base.options(route_prefix="/m").code_options == {"num_replicas": 2, "route_prefix": "/m"}
    assert base.code_options is not base.code_options  # callers get copies


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"num_replica": 2}, TypeError, "unknown deployment option 'num_replica'"),
        ({"num_replicas": 0}, ValueError, "num_replicas"),
        ({"num_replicas": "many"}, ValueError, "num_replicas"),
        ({"max_ongoing_requests": True}, ValueError, "max_ongoing_requests"),
        ({"health_check_period_s": 0}, ValueError, "greater than 0"),
        ({"graceful_shutdown_timeout_s": -1}, ValueError, "at least 0"),
        ({"route_prefix": "api"}, ValueError, "route_prefix"),
        ({"max_ongoing_requests": 2, "max_concurrent_queries": 3}, ValueError, "same option"),
    ],
)
def test_invalid_options_fail_at_decoration(
    options: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        deployment(**options)(Model)


def test_deployment_cannot_be_called_or_decorated_twice() -> None:
    dep = deployment(Model)
    with pytest.raises(TypeError, match=r"use \.bind"):
        dep()
    with pytest.raises(TypeError, match="applied twice"):
        deployment(dep)


def test_package_reexports_the_sdk() -> None:
    for name in kubeserve.__all__:
        assert hasattr(kubeserve, name), name
    assert kubeserve.deployment is deployment


def test_a_module_of_plain_deployments_loads_no_schema() -> None:
    """Every replica imports its application's module: options kubeserve honours are checked
    without pydantic and the config models, which load only for a refused option or a dict
    config (validated by the config's own models)."""
    code = (
        "import sys\n"
        "from kubeserve import deployment\n"
        "@deployment(num_replicas=2, max_ongoing_requests=3, route_prefix=None)\n"
        "class A:\n    pass\n"
        "app = A.bind()\n"
        "print([m for m in sys.modules if m.startswith(('pydantic', 'kubeserve.schema'))])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
