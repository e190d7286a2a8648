"""The discovery snapshot the local controller publishes to proxies and handles (long-poll)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from kubeserve.runtime import wire


class SnapshotPublisher:
    """Owns the current :class:`wire.Snapshot`; its version moves only when the content changes.

    Versions start at the run's start time in microseconds, so a snapshot of this run never has
    the version of one a proxy kept from an earlier run (it would take it for one it has).
    Closed until :meth:`open`: a new controller that adopts an earlier run's replicas publishes
    nothing until they are back in its deployments, and pollers keep what they have meanwhile.
    """

    def __init__(self) -> None:
        self._version = time.time_ns() // 1000
        self._routes: list[wire.Route] = []
        self._deployments: dict[str, wire.DeploymentEndpoints] = {}
        self._timeouts: wire.ProxyTimeouts | None = None
        self._changed = asyncio.Event()
        self._open = asyncio.Event()

    def open(self) -> None:
        self._open.set()

    @property
    def current(self) -> wire.Snapshot:
        snapshot: wire.Snapshot = {
            "version": self._version,
            "routes": self._routes,
            "deployments": self._deployments,
        }
        if self._timeouts is not None:
            snapshot["proxy_timeouts"] = self._timeouts
        return snapshot

    def publish(
        self,
        routes: list[wire.Route],
        deployments: dict[str, wire.DeploymentEndpoints],
        timeouts: wire.ProxyTimeouts | None = None,
    ) -> None:
        if (routes, deployments, timeouts) == (self._routes, self._deployments, self._timeouts):
            return
        self._routes, self._deployments, self._timeouts = routes, deployments, timeouts
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, known_version: int, timeout_s: float) -> wire.Snapshot:
        """The snapshot once its version differs from ``known_version``, or after ``timeout_s``.

        While closed, the answer after ``timeout_s`` is an empty snapshot of ``known_version``
        itself: nothing new, which a poller ignores."""
        if not self._open.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._open.wait(), timeout_s)
            if not self._open.is_set():
                return {"version": known_version, "routes": [], "deployments": {}}
        if known_version == self._version:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout_s)
        return self.current
