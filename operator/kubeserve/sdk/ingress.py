"""``@ingress(app)``: a class deployment whose HTTP traffic an ASGI application (FastAPI,
Starlette, any ASGI callable) serves, with the replica's instance as ``self`` of its routes.

The decorator only records the app on the class (:data:`INGRESS_ATTR`); the replica runs it
(:mod:`kubeserve.runtime.replica.asgi`). For a FastAPI app, routes declared on methods of the class
(``@app.get("/") def root(self): ...``) become class-based views: their ``self`` parameter is
filled, through a FastAPI dependency, with the deployment instance of the replica serving the
request (:func:`kubeserve.sdk.context.get_replica_context`), as Ray Serve does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from kubeserve.sdk.context import get_replica_context

__all__ = ["INGRESS_ATTR", "asgi_app_of", "ingress"]

#: The class attribute holding the ASGI app of an ingress deployment.
INGRESS_ATTR = "__kubeserve_asgi_app__"


def asgi_app_of(target: Any) -> Any:
    """The ASGI app a deployment class (or instance) was decorated with, or None."""
    return getattr(target, INGRESS_ATTR, None)


def ingress(app: Any) -> Callable[[type], type]:
    """Serve a class deployment's HTTP traffic with ``app`` (an ASGI app, or a function returning
    one, called once per replica)."""
    if not callable(app):
        raise TypeError(f"@serve.ingress needs an ASGI application, got {type(app).__name__}")

    def decorator(cls: type) -> type:
        if not inspect.isclass(cls):
            raise ValueError("@serve.ingress must be used with a class.")
        if "__call__" in cls.__dict__:
            raise ValueError(
                "Class passed to @serve.ingress may not have __call__ method: "
                "the ASGI app serves its HTTP traffic"
            )
        asgi = app() if inspect.isfunction(app) else app
        if _is_fastapi(asgi):
            _class_based_views(asgi, cls)
        setattr(cls, INGRESS_ATTR, asgi)
        return cls

    return decorator


def _is_fastapi(app: Any) -> bool:
    return any(base.__module__.startswith("fastapi") for base in type(app).__mro__)


def _walk_routes(router: Any, prefix: str = "") -> Iterator[tuple[Any, Any, str]]:
    """``(route, owning router, include prefix)`` of every endpoint route, included routers too
    (FastAPI >= 0.137 nests them instead of copying their routes)."""
    for route in list(getattr(router, "routes", [])):
        original = getattr(route, "original_router", None)
        if original is not None:
            context = getattr(route, "include_context", None)
            yield from _walk_routes(original, prefix + (getattr(context, "prefix", "") or ""))
        elif hasattr(route, "endpoint") and hasattr(route, "dependant"):
            yield route, router, prefix


async def _current_instance() -> Any:
    context = get_replica_context()
    if context is None or context.servable_object is None:
        raise RuntimeError("a class-based route runs only inside a kubeserve replica")
    return context.servable_object


def _owned_by(endpoint: Any, cls: type) -> bool:
    qualname = getattr(endpoint, "__qualname__", "")
    return any(
        qualname.startswith(base.__qualname__ + ".") for base in cls.__mro__ if base is not object
    )


def _class_based_views(app: Any, cls: type) -> None:
    """Re-register the routes whose endpoints are methods of ``cls`` so that FastAPI injects the
    replica's instance as ``self`` (their other parameters become keyword-only)."""
    from fastapi import APIRouter, Depends
    from starlette.routing import compile_path

    moved = APIRouter()
    for route, owner, prefix in list(_walk_routes(app.router)):
        if not _owned_by(route.endpoint, cls):
            continue
        parameters = list(inspect.signature(route.endpoint).parameters.values())
        if not parameters:
            raise TypeError(f"route {route.path!r}: a method of an ingress class takes self first")
        owner.routes.remove(route)
        if prefix:
            route.path = prefix + route.path
            route.path_regex, route.path_format, route.param_convertors = compile_path(route.path)
        first = parameters[0].replace(default=Depends(_current_instance))
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters[1:]]
        route.endpoint.__signature__ = inspect.signature(route.endpoint).replace(
            parameters=[first, *rest]
        )
        moved.routes.append(route)
    if moved.routes:
        app.include_router(moved)
