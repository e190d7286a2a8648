"""Callers (proxies, handles) tell the controller how many requests wait for a replica.

Replicas know what they run; only a caller knows what waits for a slot, and only a caller sees
requests for a deployment scaled to zero. The autoscaler adds both (Ray 2.60 does the same with
its handles' queued-request metrics).

:class:`LoadReporter` sends ``{deployment key: requests waiting}`` of one :class:`Router` to
``GET {controller}/-/load`` (signed like discovery, the report in the signed query) every
``interval_s`` while anything waits, once more when the queues empty, and at once when a request
starts waiting on a deployment without replicas (:attr:`Router.on_starved`): that report is what
starts a replica of a deployment scaled to zero. Reports are best effort: a lost one is replaced by
the next.

The controller is the local backend's (``kubeserve start``) or, in a cluster, the operator's admin
server; there a report also names its ``instance`` (``namespace/name``, the ``scope``), whose
data-plane secret signs it.

Ownership: the reporter owns its background task; it reads the router on the router's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os

from kubeserve.runtime.discovery import Discovery, EndpointSource, controller_address, signed_get
from kubeserve.runtime.router import Router
from kubeserve.runtime.tasks import cancel_and_wait
from kubeserve.runtime.wire import LOAD_PATH

__all__ = ["DEFAULT_REPORT_INTERVAL_S", "LoadReporter", "controller_links"]

log = logging.getLogger(__name__)

#: How often a caller with queued requests reports them.
DEFAULT_REPORT_INTERVAL_S = 1.0
_REPORT_TIMEOUT_S = 5.0


class LoadReporter:
    def __init__(
        self,
        controller_url: str,
        router: Router,
        *,
        secret: bytes,
        source_id: str | None = None,
        interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        scope: str | None = None,
    ) -> None:
        self._host, self._port = controller_address(controller_url)
        self._router = router
        self._secret = secret
        self.source_id = source_id or os.urandom(16).hex()  # (no uuid: it imports platform)
        self._scope = scope
        self._interval_s = interval_s
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        router.on_starved = self.report_soon

    def report_soon(self, key: str = "") -> None:
        """Report now instead of at the next interval."""
        self._kick.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kubeserve-load-report")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        reported_waiting = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self._interval_s)
            self._kick.clear()
            queued = {key: n for key, n in self._router.queued_counts().items() if n}
            if not queued and not reported_waiting:
                continue  # idle, and the controller already knows
            try:
                await self._send(queued)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("load report to the controller failed: %s", exc)
                continue
            reported_waiting = bool(queued)

    async def _send(self, queued: dict[str, int]) -> None:
        from urllib.parse import urlencode  # at the first report: a proxy nothing waits in skips it

        fields = {"source": self.source_id, "queued": json.dumps(queued)}
        if self._scope is not None:
            fields["instance"] = self._scope
        query = urlencode(fields)
        async with asyncio.timeout(_REPORT_TIMEOUT_S):
            status, body = await signed_get(
                self._host, self._port, f"{LOAD_PATH}?{query}", self._secret
            )
        if status != 200:
            raise RuntimeError(f"controller answered {status}: {body[:200]!r}")


def controller_links(
    controller_url: str | None,
    source: EndpointSource | None,
    router: Router,
    *,
    secret: bytes,
    caller: str,
    scope: str | None = None,
) -> tuple[EndpointSource, LoadReporter | None]:
    """Where a caller (a proxy, a handle client) learns the endpoints and reports its queues.

    ``source`` when given (Kubernetes, tests), else the local controller's :class:`Discovery` at
    ``controller_url``; a :class:`LoadReporter` for ``router`` whenever there is a controller to
    report to. ``caller`` names the caller in the error when neither is given; ``scope`` is the
    ``namespace/instance`` a report names in a cluster.
    """
    if source is None:
        if controller_url is None:
            raise ValueError(f"{caller} needs a controller_url or an endpoint source")
        source = Discovery(controller_url, secret=secret)
    reporter = (
        None
        if controller_url is None
        else LoadReporter(controller_url, router, secret=secret, scope=scope)
    )
    return source, reporter
