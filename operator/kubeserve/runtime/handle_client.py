"""Carries :class:`~kubeserve.sdk.handle.DeploymentHandle` calls to replicas.

Implements :class:`kubeserve.sdk.transport.HandleTransport`: the router picks a replica of the
target deployment (same policy and caps as the proxy), the call goes out as
``POST /-/call/<method>`` with a :func:`~kubeserve.runtime.wire.encode_call` body over a keep-alive
connection pool, and the answer is decoded (200) or re-raised (500).

Ownership: a :class:`HandleClient` owns its router, its endpoint source (which keeps the router
fresh) and its HTTP session; one per process, installed with ``sdk.transport.set_transport``.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from kubeserve.runtime.discovery import Discovery, EndpointSource
from kubeserve.runtime.router import NoReplicaAvailable, Router
from kubeserve.runtime.wire import (
    CALL_PREFIX,
    Snapshot,
    decode_result,
    deployment_key,
    encode_call,
)
from kubeserve.sdk.errors import DeploymentUnavailableError

__all__ = ["DEFAULT_CALL_TIMEOUT_S", "HandleClient"]

#: How long a call waits for a replica slot before DeploymentUnavailableError.
DEFAULT_CALL_TIMEOUT_S = 30.0
_CONTENT_TYPE = {"Content-Type": "application/octet-stream"}


class HandleClient:
    """A :class:`~kubeserve.sdk.transport.HandleTransport` over HTTP/1.1 keep-alive."""

    def __init__(
        self,
        controller_url: str | None = None,
        *,
        assign_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        source: EndpointSource | None = None,
        router: Router | None = None,
    ) -> None:
        self.router = router or Router()
        self._assign_timeout_s = assign_timeout_s
        if source is None:
            if controller_url is None:
                raise ValueError("a handle client needs a controller_url or an endpoint source")
            source = Discovery(controller_url, self.apply)
        self._source = source
        self._session: aiohttp.ClientSession | None = None

    def apply(self, snapshot: Snapshot) -> None:
        """Install a discovery snapshot (routes are a proxy concern; handles need replicas only)."""
        self.router.update(snapshot["deployments"])

    async def start(self) -> None:
        # One connector shared by all replicas; no per-host cap beyond max_ongoing_requests,
        # which the router enforces. No total timeout: a user's method may run long.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=10)
        )
        await self._source.start()

    async def close(self) -> None:
        await self._source.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if self._session is None:
            raise RuntimeError("HandleClient.call before start()")
        key = deployment_key(app, deployment)
        try:
            replica = await self.router.assign(key, self._assign_timeout_s)
        except NoReplicaAvailable as exc:
            raise DeploymentUnavailableError(str(exc)) from None
        url = f"http://{replica.host}:{replica.port}{CALL_PREFIX}{method}"
        try:
            async with self._session.post(
                url, data=encode_call(args, kwargs), headers=_CONTENT_TYPE
            ) as resp:
                body = await resp.read()
                status = resp.status
        except aiohttp.ClientConnectionError as exc:
            raise DeploymentUnavailableError(
                f"replica {replica.replica_id} of {key} failed: {exc}"
            ) from exc
        finally:
            self.router.release(replica)
        if status == 200:
            return decode_result(body)
        if status == 500:
            error = decode_result(body)
            if isinstance(error, BaseException):
                raise error
            raise RuntimeError(f"{key}.{method} failed: {error!r}")
        raise DeploymentUnavailableError(
            f"replica {replica.replica_id} of {key} answered {status}: {body[:200]!r}"
        )
