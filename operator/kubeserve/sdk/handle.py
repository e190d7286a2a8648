"""``DeploymentHandle``: how one deployment calls another.

A handle is only a name plus call options, ``(app, deployment, method, stream, model id)``; it
carries no connection, so it pickles into another process and works there. Calls go through the
process's :class:`~kubeserve.sdk.transport.HandleTransport`, looked up when the call is made.

``handle.remote(...)`` starts the call at once when an event loop is running (so several calls run
concurrently) and returns a :class:`DeploymentResponse` to ``await`` (or, from a thread without an
event loop, to wait on with :meth:`DeploymentResponse.result`). A response passed as an argument to
another ``.remote()`` call is awaited first, and its result is sent instead. With
``handle.options(stream=True)`` the call runs a generator method and returns a
:class:`DeploymentResponseGenerator` yielding its items as the replica produces them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Coroutine, Generator, Iterator
from typing import Any

from kubeserve.sdk import context
from kubeserve.sdk.errors import RequestCancelledError
from kubeserve.sdk.transport import (
    call_starter,
    get_transport,
    running_transport_loop,
    transport_loop,
)

_CALL = "__call__"

_SYNC_IN_LOOP = (
    "Sync methods should not call `.result()` when called from an asyncio event loop: "
    "this deployment's runtime_env sets RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0, which runs sync "
    "methods on the replica's event loop. Remove it, or make the method `async def` and use "
    "`await response` instead."
)


_transport_loop = running_transport_loop
#: the running loop, or None (``asyncio.get_running_loop`` without its RuntimeError)
_running_loop = asyncio._get_running_loop
_new = object.__new__


def _in_callers_context(coro: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
    """``coro``, to run on another thread's loop with this thread's request context (a sync
    method on a worker thread calls out: the callee must see the request it serves)."""
    current = context.request_context.get()
    if current is None:
        return coro

    async def in_context() -> Any:
        context.request_context.set(current)  # in this task's own context copy only
        return await coro

    return in_context()


class DeploymentResponse:
    """The pending result of a handle call; ``await`` it for the value or the callee's exception,
    or call :meth:`result` from synchronous code running outside the event loop."""

    __slots__ = ("_cancelled", "_coro", "_future", "_task")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._cancelled = False
        self._coro: Coroutine[Any, Any, Any] | None = coro
        self._task: asyncio.Future[Any] | None = None
        self._future: concurrent.futures.Future[Any] | None = None
        running, home = _running_loop(), _transport_loop()
        if home is not None and running is not home:
            # A thread without a loop (a sync method on a worker thread, a script) or another
            # loop (an async script): the call runs on the transport's loop, started at once.
            self._future = asyncio.run_coroutine_threadsafe(_in_callers_context(coro), home)
            self._coro = None
        elif running is not None:  # _start's, written out: once per call
            self._task = running.create_task(coro)
            self._coro = None

    def _start(self) -> asyncio.Future[Any]:
        if self._task is None and self._future is None and self._coro is None:
            raise RequestCancelledError()  # cancelled before it was started
        if self._task is None:
            if self._future is not None:
                self._task = asyncio.wrap_future(self._future)
            else:
                assert self._coro is not None
                self._task = asyncio.ensure_future(self._coro)
                self._coro = None
        return self._task

    def __await__(self) -> Generator[Any, None, Any]:
        try:
            return (yield from self._start().__await__())
        except asyncio.CancelledError:
            if self._cancelled:  # cancelled by its caller, not the awaiting task: Ray's error
                raise RequestCancelledError() from None
            raise

    def result(self, *, timeout_s: float | None = None) -> Any:
        """Block until the result is there (raises :class:`TimeoutError` after ``timeout_s``,
        with Ray's words).

        Only for synchronous code outside an event loop (a script, a thread of a replica): the
        call runs on the loop the process's handle transport runs on.
        """
        if _running_loop() is not None:
            raise RuntimeError(_SYNC_IN_LOOP)
        if self._future is None and self._task is None and self._coro is None:
            raise RequestCancelledError()  # cancelled before it was started
        if self._future is None:
            if self._task is not None:  # started on a loop that is not running here
                task = self._task
                self._future = asyncio.run_coroutine_threadsafe(_wait(task), task.get_loop())
            else:
                assert self._coro is not None
                coro, self._coro = self._coro, None
                self._future = asyncio.run_coroutine_threadsafe(
                    _in_callers_context(coro), transport_loop()
                )
        try:
            return self._future.result(timeout_s)
        except concurrent.futures.CancelledError:
            raise RequestCancelledError() from None
        except concurrent.futures.TimeoutError:
            if not self._future.done():  # a callee's own TimeoutError goes through as it is
                raise TimeoutError("Timed out waiting for result.") from None
            raise

    def cancel(self) -> None:
        """Stop waiting for the result (the replica may still run the call): ``.result()`` and
        ``await`` raise :class:`~kubeserve.sdk.errors.RequestCancelledError`, as in Ray."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()
        elif self._future is not None:
            self._future.cancel()
        elif self._coro is not None:
            self._coro.close()
            self._coro = None


async def _wait(future: asyncio.Future[Any]) -> Any:
    return await future


class DeploymentResponseGenerator:
    """The items of a streamed handle call (``handle.options(stream=True)``), as they arrive:
    ``async for`` inside an event loop, plain ``for`` from synchronous code outside one."""

    __slots__ = ("_items", "_start_items")

    def __init__(self, start: Any) -> None:
        self._start_items = start  # () -> AsyncIterator[Any]
        self._items: AsyncIterator[Any] | None = None

    def _iterator(self) -> AsyncIterator[Any]:
        if self._items is None:
            self._items = self._start_items()
        return self._items

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        return await anext(self._iterator())

    def __iter__(self) -> Iterator[Any]:
        if _running_loop() is not None:
            raise RuntimeError(_SYNC_IN_LOOP.replace("`.result()`", "`for ... in`"))
        loop = transport_loop()
        iterator = self._iterator()
        while True:
            try:
                yield asyncio.run_coroutine_threadsafe(_next(iterator), loop).result()
            except StopAsyncIteration:
                return

    def cancel(self) -> None:
        """Stop the stream: the replica's generator is closed."""
        items = self._items
        if items is not None and hasattr(items, "aclose"):
            loop = _running_loop()
            if loop is not None:
                loop.create_task(items.aclose())


async def _next(iterator: AsyncIterator[Any]) -> Any:
    return await anext(iterator)


class DeploymentHandle:
    """Calls methods of the replicas of one deployment: ``await handle.remote(...)`` runs
    ``__call__``, ``await handle.method.remote(...)`` runs ``method``."""

    #: ``__dict__`` keeps the ``handle.method`` callers made (see ``__getattr__``)
    __slots__ = (
        "__dict__",
        "app_name",
        "deployment_name",
        "method_name",
        "multiplexed_model_id",
        "stream",
    )

    def __init__(
        self,
        app_name: str,
        deployment_name: str,
        method_name: str = _CALL,
        *,
        stream: bool = False,
        multiplexed_model_id: str = "",
    ) -> None:
        self.app_name = app_name
        self.deployment_name = deployment_name
        self.method_name = method_name
        self.stream = stream
        self.multiplexed_model_id = multiplexed_model_id

    def options(
        self,
        *,
        method_name: str | None = None,
        multiplexed_model_id: str | None = None,
        stream: bool | None = None,
        use_new_handle_api: bool | None = None,
        session_id: str | None = None,
        _prefer_local_routing: bool | None = None,
        _by_reference: bool | None = None,
        request_serialization: str | None = None,
        response_serialization: str | None = None,
    ) -> DeploymentHandle:
        """A copy of this handle with these options (Ray's ``DeploymentHandle.options``).

        ``session_id``, local-routing preference and serialization choices are accepted and have
        no effect: every call is routed by load and pickled.
        """
        return DeploymentHandle(
            self.app_name,
            self.deployment_name,
            method_name or self.method_name,
            stream=self.stream if stream is None else bool(stream),
            multiplexed_model_id=(
                self.multiplexed_model_id
                if multiplexed_model_id is None
                else str(multiplexed_model_id)
            ),
        )

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handle's method on one replica: a :class:`DeploymentResponse`, or a
        :class:`DeploymentResponseGenerator` when the handle streams."""
        return self._remote(self.method_name, args, kwargs)

    def _remote(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.stream:
            return DeploymentResponseGenerator(lambda: self._stream(method, args, kwargs))
        running = _running_loop()
        if running is not None and not ((args or kwargs) and _has_responses(args, kwargs)):
            # On the transport's loop, with no response among the arguments to wait for: the
            # transport starts the call now (the common case writes it before returning).
            start = call_starter(running)
            if start is not None:
                started = start(
                    self.app_name, self.deployment_name, method, args, kwargs,
                    self.multiplexed_model_id,
                )  # fmt: skip
                if started is not None:
                    response: DeploymentResponse = _new(DeploymentResponse)
                    response._cancelled = False
                    response._coro = response._future = None
                    response._task = started
                    return response
        return DeploymentResponse(self._call(method, args, kwargs))

    def __getattr__(self, name: str) -> _MethodCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        # Kept: the next ``handle.method`` (every call of a method, in a request handler) is
        # found by plain attribute lookup, without this call.
        caller = self.__dict__[name] = _MethodCaller(self, name)
        return caller

    def _call_options(self) -> dict[str, Any]:
        return {"model_id": self.multiplexed_model_id} if self.multiplexed_model_id else {}

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args or kwargs:
            args, kwargs = await _resolve_all(args, kwargs)
        if self.multiplexed_model_id:
            return await get_transport().call(
                self.app_name, self.deployment_name, method, args, kwargs, **self._call_options()
            )
        return await get_transport().call(self.app_name, self.deployment_name, method, args, kwargs)

    async def _stream(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        args, kwargs = await _resolve_all(args, kwargs)
        items = get_transport().stream(
            self.app_name, self.deployment_name, method, args, kwargs, **self._call_options()
        )
        async for item in items:
            yield item

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self._key())

    def _key(self) -> tuple[str, str, str, bool, str]:
        return (
            self.app_name,
            self.deployment_name,
            self.method_name,
            self.stream,
            self.multiplexed_model_id,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeploymentHandle):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        method = "" if self.method_name == _CALL else f", method_name={self.method_name!r}"
        stream = ", stream=True" if self.stream else ""
        return f"DeploymentHandle({self.app_name!r}, {self.deployment_name!r}{method}{stream})"


def _rebuild(
    app: str, deployment: str, method: str, stream: bool = False, model_id: str = ""
) -> DeploymentHandle:
    return DeploymentHandle(app, deployment, method, stream=stream, multiplexed_model_id=model_id)


class _MethodCaller:
    """``handle.method``: ``.remote(...)`` calls that method."""

    __slots__ = ("_handle", "_method")

    def __init__(self, handle: DeploymentHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle._remote(self._method, args, kwargs)

    def options(self, **options: Any) -> DeploymentHandle:
        return self._handle.options(method_name=self._method, **options)


def _has_responses(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a :class:`DeploymentResponse` is among ``args`` and ``kwargs`` (awaited first)."""
    return any(isinstance(a, DeploymentResponse) for a in (*args, *kwargs.values()))


async def _resolve_all(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not any(isinstance(a, DeploymentResponse) for a in (*args, *kwargs.values())):
        return args, kwargs
    return (
        tuple([await _resolve(a) for a in args]),
        {k: await _resolve(v) for k, v in kwargs.items()},
    )


async def _resolve(value: Any) -> Any:
    return await value if isinstance(value, DeploymentResponse) else value
