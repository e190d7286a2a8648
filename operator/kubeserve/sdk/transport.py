"""The seam between user-facing handles and the data plane that carries their calls.

:class:`~kubeserve.sdk.handle.DeploymentHandle` lives in the SDK (users import it), but calling a
replica needs the runtime's router and connection pool. The runtime installs one
:class:`HandleTransport` per process with :func:`set_transport` before user code runs; handles look
it up at call time, so a handle built while the application is imported (before the transport
exists) still works once it is used.
"""

from __future__ import annotations

from typing import Any, Protocol


class HandleTransport(Protocol):
    async def call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``method`` on one replica of ``app``/``deployment`` and return its result.

        Raises the user's exception when the method raised, and
        :class:`kubeserve.sdk.errors.DeploymentUnavailableError` when no replica could take the
        call.
        """
        ...


_transport: HandleTransport | None = None


def set_transport(transport: HandleTransport | None) -> None:
    global _transport
    _transport = transport


def get_transport() -> HandleTransport:
    if _transport is None:
        raise RuntimeError(
            "no handle transport in this process: "
            "DeploymentHandle calls work inside a kubeserve replica"
        )
    return _transport
