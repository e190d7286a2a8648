"""The seam between user-facing handles and the data plane that carries their calls.

:class:`~kubeserve.sdk.handle.DeploymentHandle` lives in the SDK (users import it), but calling a
replica needs the runtime's router and connection pool. The runtime installs one
:class:`HandleTransport` per process with :func:`set_transport` before user code runs; handles look
it up at call time, so a handle built while the application is imported (before the transport
exists) still works once it is used. The event loop the transport was installed on is kept too:
a synchronous caller on another thread (``response.result()``) runs its call there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol


class HandleTransport(Protocol):
    async def call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
    ) -> Any:
        """Run ``method`` on one replica of ``app``/``deployment`` and return its result.

        Raises the user's exception when the method raised, and
        :class:`kubeserve.sdk.errors.DeploymentUnavailableError` when no replica could take the
        call. ``model_id`` is the multiplexed model the call is for ("" for none).
        """
        ...

    def stream(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
    ) -> AsyncIterator[Any]:
        """Run the generator ``method`` on one replica and yield its items as they come."""
        ...


_transport: HandleTransport | None = None
_loop: asyncio.AbstractEventLoop | None = None


def set_transport(transport: HandleTransport | None) -> None:
    """Install (or, with None, remove) the process's transport, on the running loop if any."""
    global _transport, _loop
    _transport = transport
    try:
        _loop = asyncio.get_running_loop() if transport is not None else None
    except RuntimeError:
        _loop = None


def get_transport() -> HandleTransport:
    if _transport is None:
        raise RuntimeError(
            "no handle transport in this process: "
            "DeploymentHandle calls work inside a kubeserve replica"
        )
    return _transport


def running_transport_loop() -> asyncio.AbstractEventLoop | None:
    """:func:`transport_loop`, or None where it raises (no transport, or no running loop):
    asked at every ``.remote()``, so without raising."""
    loop = _loop
    if _transport is None or loop is None or loop.is_closed():
        return None
    return loop


def call_starter(loop: asyncio.AbstractEventLoop) -> Any:
    """The transport's ``start_call`` (a call started at once, see
    :meth:`~kubeserve.runtime.handle_client.HandleClient.start_call`) when ``loop`` (the running
    one) is the transport's and the transport has one, else None."""
    if loop is not _loop or _transport is None:
        return None
    return getattr(_transport, "start_call", None)


def transport_loop() -> asyncio.AbstractEventLoop:
    """The loop the transport runs on, for calls made from other threads."""
    get_transport()
    if _loop is None or _loop.is_closed():
        raise RuntimeError("the handle transport of this process has no running event loop")
    return _loop
