"""Where proxies and handles learn the routes and the running replicas.

:class:`EndpointSource` is the seam: something that, once started with a callback, calls it with
a :class:`~kubeserve.runtime.wire.Snapshot` each time the data plane changes. :class:`Discovery` is
the local backend's source (a long-poll on the controller); a Kubernetes source can build the same
snapshots from EndpointSlices and the routes in custom-resource status.

Ownership: a source owns its background task and the connection of the poll in progress;
the callback is called on the event loop, one snapshot at a time, in version order, never
concurrently, and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from kubeserve.runtime import channel
from kubeserve.runtime.http1 import read_response
from kubeserve.runtime.tasks import cancel_and_wait
from kubeserve.runtime.wire import SNAPSHOT_PATH, Snapshot

__all__ = ["Discovery", "EndpointSource", "SnapshotCallback", "controller_address", "signed_get"]

log = logging.getLogger(__name__)

SnapshotCallback = Callable[[Snapshot], None]


def controller_address(url: str) -> tuple[str, int]:
    """The host and port of the controller's ``http://host[:port]/...`` URL, as
    ``urllib.parse.urlsplit`` reads them (``[v6]`` without its brackets, lower case; no host:
    ``127.0.0.1``; no port: 80), without importing ``urllib.parse`` (with ``ipaddress``, ~0.4 MB
    of a proxy, which needs it only for a request path holding ``%``)."""
    _, sep, rest = url.partition("://")
    netloc = rest
    for end in "/?#":
        netloc = netloc.partition(end)[0]
    netloc = netloc.rpartition("@")[2] if sep else ""
    if netloc.startswith("["):
        host, _, tail = netloc[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = netloc.partition(":")
    if port and not (port.isascii() and port.isdigit()):
        raise ValueError(f"Port could not be cast to integer value as {port!r}")
    return host.lower() or "127.0.0.1", int(port) if port else 80


class EndpointSource(Protocol):
    """Feeds snapshots of routes and replicas to a callback until closed."""

    async def start(self, on_update: SnapshotCallback) -> None:
        """Begin delivering snapshots to ``on_update``; returns once the first one was delivered
        or it is late.

        Never fails because the source is briefly unreachable: it keeps retrying in the background.
        """
        ...

    async def close(self) -> None:
        """Stop delivering snapshots and release connections. Idempotent."""
        ...


class Discovery:
    """Long-polls ``GET {controller_url}/-/snapshot?version=N&timeout=S``.

    Each poll is one plain HTTP/1.1 GET on its own connection (a poll lasts up to
    ``poll_timeout_s``, so connection reuse would buy nothing), parsed with httptools. Not using an
    HTTP client library keeps it out of every replica's and proxy's imports: importing one costs
    a replica a noticeable part of its start-up time and several MB of memory.

    The controller answers at once when its version differs from ``N`` (so the first poll, with
    ``N = -1``, returns immediately and a restarted controller is picked up whatever its version),
    otherwise when it changes or ``S`` seconds pass. Errors back off exponentially with jitter,
    from ``min_backoff_s`` up to ``max_backoff_s``.
    """

    def __init__(
        self,
        controller_url: str,
        *,
        secret: bytes,
        poll_timeout_s: float = 30.0,
        first_snapshot_timeout_s: float = 10.0,
        min_backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
    ) -> None:
        self._host, self._port = controller_address(controller_url)
        self._url = controller_url.rstrip("/") + SNAPSHOT_PATH
        self._on_update: SnapshotCallback = lambda snapshot: None
        self._secret = secret
        self._poll_timeout_s = poll_timeout_s
        self._first_snapshot_timeout_s = first_snapshot_timeout_s
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._version = -1
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()

    @property
    def version(self) -> int:
        """The version of the last snapshot delivered (-1 before the first)."""
        return self._version

    async def start(self, on_update: SnapshotCallback) -> None:
        if self._task is not None:
            return
        self._on_update = on_update
        self._task = asyncio.create_task(self._run(), name="kubeserve-discovery")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first.wait(), self._first_snapshot_timeout_s)

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        backoff = self._min_backoff_s
        while True:
            try:
                snapshot = await self._poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug(
                    "discovery: %s unreachable (%s); retrying in %.2f s", self._url, exc, backoff
                )
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = self._min_backoff_s
            if snapshot["version"] != self._version:
                self._version = snapshot["version"]
                try:
                    self._on_update(snapshot)
                except Exception:
                    log.exception("discovery: applying snapshot %d failed", snapshot["version"])
                self._first.set()

    async def _poll(self) -> Snapshot:
        query = f"version={self._version}&timeout={self._poll_timeout_s}"  # (numbers: no quoting)
        # The poll's own timeout plus slack: the controller holds the request up to poll_timeout_s.
        async with asyncio.timeout(self._poll_timeout_s + 10):
            target = f"{SNAPSHOT_PATH}?{query}"
            status, raw = await signed_get(self._host, self._port, target, self._secret)
        if status != 200:
            raise RuntimeError(f"controller answered {status}")
        body = json.loads(raw)
        if not isinstance(body, dict) or "version" not in body:
            raise RuntimeError("controller answered a body that is not a snapshot")
        snapshot: Snapshot = {
            "version": int(body["version"]),
            "routes": list(body.get("routes", [])),
            "deployments": dict(body.get("deployments", {})),
        }
        timeouts = body.get("proxy_timeouts")
        if isinstance(timeouts, dict):
            snapshot["proxy_timeouts"] = {
                "request_timeout_s": _seconds(timeouts.get("request_timeout_s")),
                "keep_alive_timeout_s": _seconds(timeouts.get("keep_alive_timeout_s")) or 90.0,
            }
        return snapshot


def _seconds(value: object) -> float | None:
    """A positive number of seconds from a snapshot, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


async def signed_get(host: str, port: int, target: str, secret: bytes) -> tuple[int, bytes]:
    """``GET target`` on a fresh connection, signed with the data-plane secret (see
    :func:`kubeserve.runtime.channel.sign_request`): (status, body). Raises OSError when cut
    short."""
    signature = channel.sign_request(secret, "GET", target, time.time())
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"{channel.SIGNATURE_HEADER}: {signature}\r\n\r\n".encode()
        )
        return await read_response(reader, "controller")
    finally:
        writer.close()
