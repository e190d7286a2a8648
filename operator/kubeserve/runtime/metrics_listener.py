"""The metrics port of a proxy or replica pod: ``GET /metrics`` for Prometheus, behind a token.

On Kubernetes each proxy and replica pod serves its own samples (:mod:`kubeserve.runtime.metrics`)
on the container port ``metrics`` (:data:`~kubeserve.runtime.kubernetes.contract.METRICS_PORT`).
The data-plane port needs the handshake Prometheus cannot do, so this is a second, tiny server that
can do no harm:

* it answers only ``GET /metrics`` with ``Authorization: Bearer <token>``, the instance's metrics
  token (:func:`metrics_token`: derived from the data-plane secret, so the pod needs nothing more,
  and published by the operator in the Secret ``<instance>-metrics-token`` for Prometheus to
  present); no token or another one is a 401/403, any other request a 404, a head over 8 KiB a
  431; one answer per connection, request bodies never read;
* the token never reveals the data-plane secret (an HMAC of it), and the samples hold names and
  counts, never request contents.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging

from kubeserve.runtime.metrics import exposition
from kubeserve.runtime.one_answer import OneAnswerProtocol

__all__ = ["MetricsListener", "metrics_token", "start_metrics_listener"]

log = logging.getLogger("kubeserve.metrics")

_REASONS = {
    200: "OK",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    431: "Request Header Fields Too Large",
}
_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def metrics_token(secret: bytes) -> str:
    """The bearer token of an instance's metrics ports, from its data-plane ``secret``."""
    return hmac.new(secret, b"kubeserve metrics token", hashlib.sha256).hexdigest()


def _response(status: int, body: bytes, content_type: bytes = b"text/plain") -> bytes:
    extra = b'WWW-Authenticate: Bearer realm="kubeserve metrics"\r\n' if status == 401 else b""
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n"
    )
    return head % (status, _REASONS[status].encode(), content_type, len(body), extra) + body


class _MetricsProtocol(OneAnswerProtocol):
    """One connection: read the request head, answer, close."""

    def __init__(self, token: bytes) -> None:
        super().__init__()
        self._token = token

    def too_large(self) -> bytes:
        return _response(431, b"request head too large")

    def respond(self, head: bytes) -> bytes:
        line, *headers = head.split(b"\r\n")
        if line not in (b"GET /metrics HTTP/1.1", b"GET /metrics HTTP/1.0"):
            return _response(404, b"only GET /metrics is served here")
        given = next(
            (
                value.strip()
                for name, _, value in (h.partition(b":") for h in headers)
                if name.strip().lower() == b"authorization"
            ),
            None,
        )
        if given is None:
            return _response(401, b"send Authorization: Bearer <the metrics token>")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._token):
            return _response(403, b"wrong metrics token")
        return _response(200, exposition(), _CONTENT_TYPE)


class MetricsListener:
    """The metrics port of this process (see the module docstring)."""

    def __init__(self, secret: bytes) -> None:
        self._token = metrics_token(secret).encode()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _MetricsProtocol(self._token), host, port, reuse_address=True
        )
        log.info("metrics on %s:%d (GET /metrics, bearer token)", host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


async def start_metrics_listener(
    host: str, port: int | None, secret: bytes
) -> MetricsListener | None:
    """This process's metrics port, when its command was given one (a pod's: the operator sets
    ``KUBESERVE_METRICS_PORT``, read where the pod's commands are composed,
    :mod:`kubeserve.runtime.kubernetes.pod`); None without."""
    if port is None:
        return None
    listener = MetricsListener(secret)
    await listener.start(host, port)
    return listener
