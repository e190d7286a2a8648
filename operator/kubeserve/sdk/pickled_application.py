"""An application graph as bytes: how ``serve.run`` ships the application object itself.

The driver pickles the bound :class:`~kubeserve.sdk.application.Application` with cloudpickle, as
Ray does: each deployment's class or function with its bound arguments. Code defined in
``__main__``, inside a function, or in a module of the driver's own (a file beside the script or
under its working directory, not an installed package) travels by value, so the instance never
has to import the script; installed packages (and kubeserve itself) travel by reference and are
imported where the graph is loaded.

Invariant: :func:`pickle_application` either returns bytes :func:`unpickle_application` turns
back into an equal graph (on the same Python and cloudpickle), or raises
:class:`UnpicklableGraphError` naming the deployment, argument or attribute that cannot be
pickled; it never sends half a graph.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import pickle
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Any

from kubeserve.sdk.application import Application, map_nodes

__all__ = ["UnpicklableGraphError", "pickle_application", "unpickle_application"]

#: Attributes every class has, which never hold the user's objects.
_CLASS_BOOKKEEPING = frozenset({"__dict__", "__doc__", "__module__", "__qualname__", "__weakref__"})
#: How deep :func:`_culprit` looks into arguments for the object that cannot be pickled.
_SEARCH_DEPTH = 6


class UnpicklableGraphError(TypeError):
    """Part of an application graph cannot be pickled; the message names which part."""


def pickle_application(app: Application) -> bytes:
    """``app``'s graph as cloudpickle bytes (see the module docstring for what goes by value)."""
    with _by_value(_driver_modules()):
        try:
            return _dumps(app)
        except Exception as exc:
            raise UnpicklableGraphError(_describe_failure(app, exc)) from None


def unpickle_application(data: bytes) -> Application:
    """The graph :func:`pickle_application` made; raises what unpickling raises (a module the
    graph refers to by reference and this process cannot import, say)."""
    app = pickle.loads(data)
    if not isinstance(app, Application):
        raise TypeError(f"the pickled graph holds a {type(app).__name__}, not an application")
    return app


@contextlib.contextmanager
def _by_value(modules: list[ModuleType]) -> Iterator[None]:
    import cloudpickle

    registered = []
    try:
        for module in modules:
            with contextlib.suppress(ValueError):  # registered already (by the user, say)
                cloudpickle.register_pickle_by_value(module)
                registered.append(module)
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def _driver_modules() -> list[ModuleType]:
    """Modules of the driver's own: loaded from a file under the script's directory or the
    working directory, and not from an installed location (site-packages, the standard library)
    or kubeserve (whose ``ray`` the instance provides)."""
    roots = [Path.cwd().resolve()]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file:
        roots.append(Path(main_file).resolve().parent)
    installed = {
        Path(path).resolve()
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or not file or name.split(".")[0] in ("kubeserve", "ray"):
            continue
        where = Path(file).resolve()
        if any(root in where.parents for root in roots) and not any(
            place in where.parents for place in installed
        ):
            found.append(module)
    return found


def _describe_failure(app: Application, exc: Exception) -> str:
    where = _culprit(app) or f"the graph of {app.name!r}"
    return (
        f"serve.run cannot serialize the application: {where} cannot be pickled "
        f"({type(exc).__name__}: {exc}). Create such objects in the deployment's constructor "
        "instead of passing them to .bind()"
    )


def _culprit(app: Application) -> str | None:
    """Which part of the graph fails to pickle, as a user would name it."""
    for node in app.deployments():
        target = node.deployment.func_or_class
        what = "function" if node.deployment.is_function else "class"
        found = _search(target, f"the {what} of deployment {node.name!r}", _SEARCH_DEPTH)
        if found is not None:
            return found
        args = map_nodes(node.args, lambda _: None)
        kwargs = map_nodes(node.kwargs, lambda _: None)
        for index, value in enumerate(args):
            found = _search(value, f"argument {index} of {node.name}.bind()", _SEARCH_DEPTH)
            if found is not None:
                return found
        for key, value in kwargs.items():
            found = _search(value, f"argument {key!r} of {node.name}.bind()", _SEARCH_DEPTH)
            if found is not None:
                return found
    return None


def _search(value: Any, path: str, depth: int, seen: set[int] | None = None) -> str | None:
    """``path`` extended to the innermost part of ``value`` that cannot be pickled, or None;
    ``seen`` holds the objects on the way (a cycle is not looked into twice)."""
    seen = set() if seen is None else seen
    if id(value) in seen or _picklable(value):
        return None
    seen.add(id(value))
    if depth > 0:
        for part, inner in _parts(value):
            found = _search(inner, f"{path}{part}", depth - 1, seen)
            if found is not None:
                return found
    return f"{path} (a {type(value).__module__}.{type(value).__qualname__})"


def _parts(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"[{key!r}]", item
    elif isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            yield f"[{index}]", item
    elif isinstance(value, FunctionType):
        for name in value.__code__.co_names:
            if name in value.__globals__:
                yield f" (global {name!r})", value.__globals__[name]
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or (), strict=False):
            with contextlib.suppress(ValueError):
                yield f" (variable {name!r})", cell.cell_contents
    elif inspect.isclass(value):
        for name, attr in vars(value).items():
            if name not in _CLASS_BOOKKEEPING:
                yield f".{name}", attr
    else:
        with contextlib.suppress(TypeError):
            for name, attr in vars(value).items():
                yield f".{name}", attr


def _picklable(value: Any) -> bool:
    try:
        _dumps(value)
    except Exception:
        return False
    return True


def _dumps(value: Any) -> bytes:
    # cloudpickle is the driver's only: a replica unpickles with pickle, and never loads it
    import cloudpickle

    class GraphPickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            reduce = _LIBRARY_REDUCERS.get(type(obj))
            return reduce(obj) if reduce is not None else super().reducer_override(obj)

    _LIBRARY_REDUCERS.update(_library_reducers())
    buffer = io.BytesIO()
    GraphPickler(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()


def _code_keeping_its_file(code: CodeType) -> tuple[Any, ...]:
    """cloudpickle's reduction of a code object, with the file it was defined in: cloudpickle
    (>= 3.1) writes ``<dynamic-code>`` there, and the traceback of an exception raised in the
    deployment's code would name no file and show no source line; Ray's own copy of cloudpickle
    keeps it, and so do we. Where the file exists (the same machine) its lines show, elsewhere
    the frames still name the file, line and function."""
    import cloudpickle.cloudpickle as internals

    constructor, args = internals._code_reduce(code)
    return constructor, tuple(
        code.co_filename if isinstance(arg, str) and arg == "<dynamic-code>" else arg
        for arg in args
    )


#: How to pickle objects that cloudpickle does not pickle as we need: code objects (their file
#: name), and objects of the web frameworks an ingress uses that do not pickle as they are
#: (filled from :func:`_library_reducers` once their modules are loaded).
_LIBRARY_REDUCERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {CodeType: _code_keeping_its_file}


def _library_reducers() -> dict[type, Callable[[Any], tuple[Any, ...]]]:
    """* FastAPI (>= 0.137) keeps an included router (``app.include_router``, which
      ``@serve.ingress`` uses for class-based views) in an ``_IncludedRouter`` whose lock only
      guards its route cache: rebuilt with a new lock and an empty cache.
    * Starlette's ``State`` (``app.state``) answers every attribute from a dict it does not have
      yet while it is unpickled (an endless recursion): rebuilt from that dict.
    """
    reducers: dict[type, Callable[[Any], tuple[Any, ...]]] = {}
    included = getattr(sys.modules.get("fastapi.routing"), "_IncludedRouter", None)
    if inspect.isclass(included):
        reducers[included] = lambda obj: (included, (obj.original_router, obj.include_context))
    state = getattr(sys.modules.get("starlette.datastructures"), "State", None)
    if inspect.isclass(state):
        reducers[state] = lambda obj: (state, (dict(obj._state),))
    return reducers
