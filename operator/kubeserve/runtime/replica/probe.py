"""The replica's health listener for the kubelet: the one port that needs no handshake.

Every connection to the replica's own port must pass the data-plane handshake
(:mod:`kubeserve.runtime.channel`), which a kubelet's HTTP probe cannot do. So a replica in a pod
also listens on a probe port (``ReplicaConfig.probe_port``, container port ``probe``) with a tiny
server that is deliberately unable to do harm:

* it answers only ``GET /-/healthz``: 200 ``ok`` when the replica's last health check passed, 503
  (``starting``, ``unhealthy`` or ``draining``) otherwise; any other request line is a 404, a
  request head over 8 KiB a 431, and every connection is closed after one answer. Request bodies
  are never read, and nothing here parses more than the request line;
* the answer is a cached result: the replica runs the user's ``check_health`` itself every
  ``health_check_period_s``, each run limited to ``health_check_timeout_s``
  (:meth:`ProbeListener.watch`), so an unauthenticated request never runs user code and
  probing it faster does not make the user's check run more often;
* the failure's text goes to the replica's log, never to the caller (the port is reachable from
  the whole cluster).

Invariants: the listener reports 503 until :meth:`ProbeListener.watch` saw a first passing check
(so "ready" means the user object is constructed and the replica port is listening), and 503 from
:meth:`ProbeListener.drain` on (the replica stops taking work).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubeserve.runtime.one_answer import MAX_HEAD_BYTES, OneAnswerProtocol
from kubeserve.runtime.wire import HEALTHZ_PATH

__all__ = ["MAX_HEAD_BYTES", "ProbeListener"]

log = logging.getLogger("kubeserve.replica.probe")

_REQUEST_LINE = f"GET {HEALTHZ_PATH} HTTP/1.".encode()
_REASONS = {200: "OK", 404: "Not Found", 431: "Request Header Fields Too Large", 503: "Unavailable"}


def _response(status: int, text: str) -> bytes:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _ProbeProtocol(OneAnswerProtocol):
    """One connection: read up to the end of the request line, answer, close."""

    end = b"\r\n"

    def __init__(self, listener: ProbeListener) -> None:
        super().__init__()
        self._listener = listener

    def respond(self, head: bytes) -> bytes:
        if head.startswith(_REQUEST_LINE) and head[len(_REQUEST_LINE) :] in (b"0", b"1"):
            return _response(*self._listener.answer())
        return _response(404, "only GET /-/healthz is served here")

    def too_large(self) -> bytes:
        return _response(431, "request head too large")


class ProbeListener:
    """The probe port of one replica and the health state it reports (see the module docstring).

    Owns the periodic health-check task; only touched on the event loop.
    """

    def __init__(self) -> None:
        self._state = "starting"
        self._server: asyncio.AbstractServer | None = None
        self._checks: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (reporting ``starting`` until :meth:`watch` saw a pass)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ProbeProtocol(self), host, port, reuse_address=True
        )

    def answer(self) -> tuple[int, str]:
        """The status and body of ``GET /-/healthz`` now."""
        return (200, "ok") if self._state == "healthy" else (503, self._state)

    def watch(
        self, check: Callable[[], Awaitable[None]], period_s: float, timeout_s: float
    ) -> None:
        """Run ``check`` now and then every ``period_s`` (each run at most ``timeout_s``);
        report its last result until :meth:`drain`."""
        self._checks = asyncio.ensure_future(self._run_checks(check, period_s, timeout_s))

    async def _run_checks(
        self, check: Callable[[], Awaitable[None]], period_s: float, timeout_s: float
    ) -> None:
        while self._state != "draining":
            try:
                async with asyncio.timeout(timeout_s):
                    await check()
            except TimeoutError:
                self._report(False, f"check_health did not finish within {timeout_s:g} s")
            except Exception as exc:
                self._report(False, f"check_health raised {type(exc).__name__}: {exc}")
            else:
                self._report(True, "")
            await asyncio.sleep(max(period_s, 0.01))

    def _report(self, healthy: bool, error: str) -> None:
        if self._state == "draining":
            return
        state = "healthy" if healthy else "unhealthy"
        if state != self._state:
            if healthy:
                log.info("health check passes")
            else:
                log.warning("health check failed: %s", error)
        self._state = state

    def drain(self) -> None:
        """Report 503 ``draining`` from now on and stop running health checks."""
        self._state = "draining"
        if self._checks is not None:
            self._checks.cancel()

    async def close(self) -> None:
        self.drain()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
