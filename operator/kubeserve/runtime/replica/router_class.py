"""A replica's side of custom request routers: it loads its deployment's ``request_router_class``
at start-up (so a class that cannot be loaded fails the deploy) and hands it, pickled by value, to
the callers that route to it (:mod:`kubeserve.runtime.custom_router` says why the callers do not
import it themselves), and answers ``record_routing_stats`` polls.
"""

from __future__ import annotations

import importlib
import json
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from kubeserve.runtime.build import split_import_path
from kubeserve.runtime.replica.http import HttpResponse
from kubeserve.runtime.replica.user_code import UserCode, error_text, invoke

if TYPE_CHECKING:  # the SDK's router module is loaded only by a deployment that names a class
    from kubeserve.sdk.request_router import RequestRouter

__all__ = ["load_router_class", "pickled_router_class", "router_class_answer", "routing_stats"]

#: Modules never pickled by value: kubeserve's own and the names it answers (``ray``), which
#: every caller imports by reference.
_BY_REFERENCE = ("kubeserve", "ray")


def load_router_class(path: str) -> type[RequestRouter]:
    """The class at ``path`` (``module:Class`` or ``module.Class``); raises ``ImportError``,
    ``AttributeError`` or ``TypeError`` saying what is wrong with it."""
    from kubeserve.sdk.request_router import RequestRouter

    module_name, attr = split_import_path(path)
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part)
    if not (isinstance(target, type) and issubclass(target, RequestRouter)):
        raise TypeError(
            f"request_router_class {path!r} is {target!r}, not a subclass of "
            "ray.serve.request_router.RequestRouter"
        )
    return target


@cache
def pickled_router_class(path: str) -> bytes:
    """The class at ``path`` pickled by value with its module (cloudpickle), so that a process
    without the application's code can load it. Cached: a class is pickled once per replica."""
    import cloudpickle  # only replicas of deployments with a custom router load it

    cls = load_router_class(path)
    module = sys.modules[cls.__module__]
    by_value = module.__name__.partition(".")[0] not in _BY_REFERENCE
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        data: bytes = cloudpickle.dumps(cls)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
    return data


def router_class_answer(path: str) -> HttpResponse:
    """The answer to ``GET /-/request-router/<path>``."""
    try:
        pickled = pickled_router_class(path)
    except Exception as exc:
        return HttpResponse(404, error_text(exc).encode())
    return HttpResponse(200, pickled, content_type="application/octet-stream")


async def routing_stats(user: UserCode) -> HttpResponse:
    """The answer to ``GET /-/routing-stats``: what ``record_routing_stats()`` returns, as JSON."""
    hook = None if user.is_function else getattr(user.target, "record_routing_stats", None)
    if hook is None:
        return HttpResponse(404, b"the deployment has no record_routing_stats method")
    try:
        stats = await invoke(hook)
        if not isinstance(stats, dict):
            raise TypeError(f"record_routing_stats must return a dict, got {type(stats).__name__}")
        body = json.dumps(stats).encode()
    except Exception as exc:
        return HttpResponse(500, error_text(exc).encode())
    return HttpResponse(200, body, content_type="application/json")
