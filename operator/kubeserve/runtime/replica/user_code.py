"""The user's code in a replica: the deployment object (or function) and how kubeserve calls it.

Coroutines run on the event loop; sync callables in a worker thread (:func:`invoke`, as Ray does)
or, for deployments that set ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``, on the event loop too
(:func:`invoke_on_loop`). Exceptions from user code propagate to the caller, which decides what the
client sees.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubeserve.runtime import wire
from kubeserve.runtime.build import load_application, load_pickled_application
from kubeserve.runtime.thread_hop import run_sync
from kubeserve.sdk import context
from kubeserve.sdk.application import GraphNode, map_nodes
from kubeserve.sdk.handle import DeploymentHandle

__all__ = [
    "ReplicaStartupError",
    "UserCode",
    "error_text",
    "find_node",
    "generator_not_streamed",
    "invoke",
    "invoke_on_loop",
    "is_async_callable",
    "is_plain_function",
    "iterate",
    "not_a_generator",
    "takes_arguments",
]


class ReplicaStartupError(Exception):
    """The replica could not start: bad config, import error, or the user's constructor raised."""


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: ``async def`` functions and methods, and objects
    whose ``__call__`` is one (a functools.partial of either too)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    return (
        not inspect.isroutine(fn)
        and callable(fn)
        and inspect.iscoroutinefunction(type(fn).__call__)
    )


def is_plain_function(fn: Any) -> bool:
    """Whether ``fn`` is a plain ``def`` (no coroutine, no generator of either kind): its body
    runs on a worker thread, so a request for it may be stepped outside a task."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return not (
        is_async_callable(fn) or inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn)
    )


def takes_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares any parameter (``self`` of a bound method aside). An HTTP handler
    that declares none is called without the request, as Ray's replica does ("support empty HTTP
    handlers"); one whose signature cannot be read is given the request."""
    try:
        return len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        return True


async def invoke(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code: coroutines on the event loop, plain functions in a worker thread (as Ray
    does; :mod:`~kubeserve.runtime.thread_hop`, ``asyncio.to_thread``'s semantics for a third of
    its cost), so a blocking method (``time.sleep``, a model's forward pass) never stalls the
    replica's other requests or its health checks. Context variables (the request's id, the
    multiplexed model id) are copied into the thread."""
    if is_async_callable(fn):
        return await fn(*args, **kwargs)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return fn(*args, **kwargs)  # runs nothing of the body: its steps run where iterated
    result = await run_sync(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        # In a task of its own: the caller may be a handler stepped by hand, in no task (see
        # ThreadHop.then), and asyncio.timeout or a TaskGroup in the awaitable need one.
        result = await asyncio.ensure_future(result)
    return result


async def invoke_on_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`invoke` with sync callables run on the event loop itself (no thread hop), for
    deployments that set ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``: a blocking method then stalls
    the replica, and ``.result()`` on a handle is refused there."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


_END = object()


async def iterate(items: Any, run: Callable[..., Any]) -> AsyncIterator[Any]:
    """The items of a user's iterator, async or sync; a sync iterator's steps go through ``run``
    (:func:`invoke`: a worker thread, as Ray consumes a sync generator and Starlette a sync
    stream), so a generator that blocks between items (``time.sleep``, a model's next token)
    does not stall the replica."""
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
        return
    iterator = iter(items)
    while (item := await run(next, iterator, _END)) is not _END:
        yield item


def generator_not_streamed(method_name: str) -> TypeError:
    """What a unary call of a generator method raises (Ray 2.60's replica's words)."""
    return TypeError(
        f"Method '{method_name}' returned a generator. You must use "
        "`handle.options(stream=True)` to call generators on a deployment."
    )


def not_a_generator(method_name: str) -> TypeError:
    """What a streamed call (``handle.options(stream=True)``) of a method that returned no
    generator raises (Ray 2.60's replica's words)."""
    return TypeError(
        f"Called method '{method_name}' with `handle.options(stream=True)` but it did not "
        "return a generator."
    )


def error_text(exc: BaseException) -> str:
    """``Type: text``, how a replica reports an exception to its caller and in its log."""
    return f"{type(exc).__name__}: {exc}"


class UserCode:
    """The user's deployment object (or function) and the hooks kubeserve calls on it."""

    def __init__(self, name: str, target: Any, is_function: bool) -> None:
        self.name = name
        self.target = target
        self.is_function = is_function

    @classmethod
    async def construct(cls, node: GraphNode, app_name: str, replica_id: str = "") -> UserCode:
        """Build the user object with handles in place of bound nodes; user exceptions propagate.

        The replica context (``serve.get_replica_context()``) is set before the constructor runs;
        its ``servable_object`` once the object exists.
        """
        replica_context = context.ReplicaContext(
            context.ReplicaID(replica_id, context.DeploymentID(node.name, app_name))
        )
        context.set_replica_context(replica_context)

        def to_handle(child: Any) -> DeploymentHandle:
            return DeploymentHandle(app_name, child.name)

        args = map_nodes(node.args, to_handle)
        kwargs = map_nodes(node.kwargs, to_handle)
        target: Any = node.deployment.func_or_class
        if node.deployment.is_function:
            if args or kwargs:
                raise ReplicaStartupError(
                    f"function deployment {node.name!r} was bound with arguments; "
                    "only class deployments take constructor arguments"
                )
            replica_context.servable_object = target
            return cls(node.name, target, is_function=True)
        init = getattr(target, "__init__", None)
        if inspect.iscoroutinefunction(init):
            instance = target.__new__(target)
            await init(instance, *args, **kwargs)
        else:
            instance = target(*args, **kwargs)
        replica_context.servable_object = instance
        return cls(node.name, instance, is_function=False)

    def method(self, name: str) -> Callable[..., Any] | None:
        """The callable a handle call or HTTP request named ``name`` runs, or None when there is
        none (private dunder methods other than ``__call__`` are never exposed)."""
        if self.is_function:
            return self.target if name == "__call__" else None
        if name.startswith("__") and name != "__call__":
            return None
        found = getattr(self.target, name, None)
        return found if callable(found) else None

    async def reconfigure(self, user_config: Any) -> None:
        """Apply ``user_config``; a no-op for ``None``. Raises what the user's hook raised."""
        if user_config is None:
            return
        hook = None if self.is_function else getattr(self.target, "reconfigure", None)
        if hook is None:
            raise ValueError(
                f"user_config is set but deployment {self.name!r} has no reconfigure method"
            )
        await invoke(hook, user_config)

    async def check_health(self) -> None:
        hook = None if self.is_function else getattr(self.target, "check_health", None)
        if hook is not None:
            await invoke(hook)


def find_node(config: wire.ReplicaConfig) -> GraphNode:
    """This replica's deployment in the graph its config's ``app_graph`` or ``app_graph_file``
    holds (an application deployed with ``serve.run``), else in the one its ``import_path``
    builds."""
    pickled = config.get("app_graph")
    graph_file = config.get("app_graph_file")
    if pickled or graph_file:
        if pickled:
            data = base64.b64decode(pickled)
        else:
            with open(str(graph_file), "rb") as file:
                data = file.read()
        app = load_pickled_application(data)
        source = "the application deployed with serve.run"
    else:
        app = load_application(config["import_path"], config.get("app_args"))
        source = f"the application at {config['import_path']!r}"
    nodes = app.deployments()
    for node in nodes:
        if node.name == config["deployment"]:
            return node
    names = ", ".join(node.name for node in nodes)
    raise ReplicaStartupError(
        f"deployment {config['deployment']!r} is not in {source} (deployments: {names})"
    )
