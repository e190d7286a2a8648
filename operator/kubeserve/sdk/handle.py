"""``DeploymentHandle``: how one deployment calls another.

A handle is only a name, ``(app, deployment, method)``; it carries no connection, so it pickles into
another process and works there. Calls go through the process's
:class:`~kubeserve.sdk.transport.HandleTransport`, looked up when the call is made.

``handle.remote(...)`` starts the call at once when an event loop is running (so several calls run
concurrently) and returns a :class:`DeploymentResponse` to ``await``. A response passed as an
argument to another ``.remote()`` call is awaited first, and its result is sent instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

from kubeserve.sdk.transport import get_transport

_CALL = "__call__"


class DeploymentResponse:
    """The pending result of a handle call; ``await`` it for the value or the callee's exception."""

    __slots__ = ("_coro", "_task")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro: Coroutine[Any, Any, Any] | None = coro
        self._task: asyncio.Future[Any] | None = None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the call starts when the response is awaited
        self._start()

    def _start(self) -> asyncio.Future[Any]:
        if self._task is None:
            assert self._coro is not None
            self._task = asyncio.ensure_future(self._coro)
            self._coro = None
        return self._task

    def __await__(self) -> Generator[Any, None, Any]:
        return self._start().__await__()

    def cancel(self) -> None:
        """Stop waiting for the result (the replica may still run the call)."""
        if self._task is not None:
            self._task.cancel()
        elif self._coro is not None:
            self._coro.close()
            self._coro = None


class DeploymentHandle:
    """Calls methods of the replicas of one deployment: ``await handle.remote(...)`` runs
    ``__call__``, ``await handle.method.remote(...)`` runs ``method``."""

    __slots__ = ("app_name", "deployment_name", "method_name")

    def __init__(self, app_name: str, deployment_name: str, method_name: str = _CALL) -> None:
        self.app_name = app_name
        self.deployment_name = deployment_name
        self.method_name = method_name

    def options(self, *, method_name: str | None = None) -> DeploymentHandle:
        """A copy of this handle, calling ``method_name`` by default."""
        return DeploymentHandle(
            self.app_name, self.deployment_name, method_name or self.method_name
        )

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        """Call the handle's method on one replica; ``await`` the result."""
        return DeploymentResponse(self._call(self.method_name, args, kwargs))

    def __getattr__(self, name: str) -> _MethodCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        return _MethodCaller(self, name)

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        args = tuple([await _resolve(a) for a in args])
        kwargs = {k: await _resolve(v) for k, v in kwargs.items()}
        transport = get_transport()
        return await transport.call(self.app_name, self.deployment_name, method, args, kwargs)

    def __reduce__(self) -> tuple[type[DeploymentHandle], tuple[str, str, str]]:
        return (DeploymentHandle, (self.app_name, self.deployment_name, self.method_name))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeploymentHandle):
            return NotImplemented
        return self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash(self.__reduce__()[1])

    def __repr__(self) -> str:
        method = "" if self.method_name == _CALL else f", method_name={self.method_name!r}"
        return f"DeploymentHandle({self.app_name!r}, {self.deployment_name!r}{method})"


class _MethodCaller:
    """``handle.method``: ``.remote(...)`` calls that method."""

    __slots__ = ("_handle", "_method")

    def __init__(self, handle: DeploymentHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        return DeploymentResponse(self._handle._call(self._method, args, kwargs))


async def _resolve(value: Any) -> Any:
    return await value if isinstance(value, DeploymentResponse) else value
