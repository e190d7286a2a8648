"""What a client may send: the timeouts and size limits of the proxy and of the replica server.

One :class:`RequestLimits` is built once at start-up (``kubeserve proxy`` flags, ``kubeserve
start`` flags, the replica's :class:`~kubeserve.runtime.wire.ReplicaConfig`) and shared by every
connection. Both servers enforce the same limits, so a replica reached without the proxy (handle
calls, a misrouted client) is as well protected as the proxy, and a replica never buffers more than
a proxy would have let through.

The defaults, and why (references: nginx, Apache httpd, uvicorn/h11, Ray Serve 2.60):

* ``header_timeout_s`` 20 s to receive a complete request head once its first byte arrived,
  then 408 and close. Apache's ``mod_reqtimeout`` gives 20 s (``header=20-40``); nginx's
  ``client_header_timeout`` 60 s. A slowloris client trickling headers holds a connection for at
  most this long. A new connection that sends nothing at all is closed after this long too (the
  clock starts at accept), not after the longer keep-alive timeout.
* ``body_timeout_s`` 20 s without a single body byte while a request body is incomplete, then 408,
  close, and the replica slot the request held is released. nginx's ``client_body_timeout``
  (60 s) measures the same inactivity; 20 s (Apache's ``body=20``) is shorter than the 30 s a
  request waits for a replica slot, so stalled uploads cannot starve every other request of slots.
  Time spent with reading paused by backpressure (the replica reads slowly) never counts.
* ``send_timeout_s`` 30 s while a response cannot be written because the client takes none of
  it (the server's write buffer stays above its high-water mark, the kernel's being full), then
  the connection is aborted and the replica slot of its request released. A client that stops
  reading a streamed response (or a WebSocket) would otherwise hold its slot for as long as the
  stream lasts, which may be forever. nginx's ``send_timeout`` (60 s) and Apache's ``Timeout``
  (60 s) measure the same; 30 s lies between them and ``body_timeout_s``; a reader that drains
  the buffer's 48 KiB between high and low water within it (1.6 KB/s) is never cut off.
* ``max_url_bytes`` 8 KiB of request target, then 414: nginx's ``large_client_header_buffers``
  (8 KiB per line) and Apache's ``LimitRequestLine`` (8190) give the same bound.
* ``max_header_bytes`` 64 KiB for the whole head (request line and headers), then 431. It also
  bounds what either server buffers for an unterminated head. nginx allows 4 x 8 KiB lines, h11
  (uvicorn) 16 KiB, Go 1 MiB; 64 KiB lets large cookies and tracing headers through.
* ``max_body_bytes`` 100 MiB, then 413: refused up front on ``Content-Length``, mid-stream for
  chunked bodies. The replica buffers a whole body before user code sees it, so this is also the
  replica's memory bound per request. nginx defaults to 1 MiB and Ray Serve has no limit; 100 MiB
  admits the images, audio and documents model servers take while keeping a replica's memory
  bounded (the size Cloudflare and many API gateways accept). ``None`` disables the cap.
* ``max_connections`` 10,000 open client connections per proxy; one more is answered 503 with
  ``Retry-After: 1`` and closed at once, so idle connections cannot exhaust the proxy's file
  descriptors (it also holds one upstream connection per request in flight) and starve everyone.
  nginx's 512 ``worker_connections`` per worker is smaller; 10,000 keeps 256-connection load
  generators and large fleets of keep-alive clients far from it. The proxy raises its own
  ``RLIMIT_NOFILE`` soft limit to the hard one at start and lowers this cap to fit within it.

Invariant: every field is positive (``max_body_bytes`` may be ``None``); :meth:`from_mapping`
rejects anything else with a message naming the field.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["RequestClock", "RequestLimits", "add_limit_arguments", "limits_from_arguments"]


@dataclass(frozen=True)
class RequestLimits:
    """Timeouts and sizes a client request must stay within (see the module docstring)."""

    header_timeout_s: float = 20.0
    body_timeout_s: float = 20.0
    send_timeout_s: float = 30.0
    max_url_bytes: int = 8 * 1024
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int | None = 100 * 1024 * 1024
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_body_bytes":
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"request limit {f.name} must be a positive number, not {value!r}")

    @property
    def shortest_timeout_s(self) -> float:
        """How often a connection with a request in progress checks its deadlines."""
        return min(self.header_timeout_s, self.body_timeout_s)

    def to_mapping(self) -> dict[str, Any]:
        """JSON-ready, for a replica's config."""
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> RequestLimits:
        """From :meth:`to_mapping`'s output; missing keys take the defaults, unknown ones fail."""
        if not values:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown request limits: {', '.join(unknown)}")
        return cls(**dict(values))

    def cli_args(self) -> list[str]:
        """The ``kubeserve proxy`` flags that reproduce these limits."""
        args: list[str] = []
        for name, value in asdict(self).items():
            flag = "--" + name.replace("_", "-")
            args += [flag, "0" if value is None else str(value)]
        return args


_HELP = {
    "header_timeout_s": "seconds to receive a whole request head, else 408 (default %(default)s)",
    "body_timeout_s": "seconds without a request body byte, else 408 (default %(default)s)",
    "send_timeout_s": "seconds a client may take no response byte, else abort "
    "(default %(default)s)",
    "max_url_bytes": "longest request target, else 414 (default %(default)s)",
    "max_header_bytes": "largest request head, else 431 (default %(default)s)",
    "max_body_bytes": "largest request body, else 413; 0: no limit (default %(default)s)",
    "max_connections": "open client connections, more are answered 503 (default %(default)s)",
}


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--header-timeout-s``... flags of :class:`RequestLimits` (``kubeserve proxy`` and
    ``kubeserve start`` share them; :meth:`RequestLimits.cli_args` writes them)."""
    defaults = RequestLimits()
    for f in fields(RequestLimits):
        kind = float if f.name.endswith("_s") else int
        default = getattr(defaults, f.name)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=kind,
            default=0 if default is None else default,
            help=_HELP[f.name],
        )


def limits_from_arguments(args: argparse.Namespace) -> RequestLimits:
    """The :class:`RequestLimits` of parsed :func:`add_limit_arguments` flags."""
    values = {f.name: getattr(args, f.name) for f in fields(RequestLimits)}
    if not values["max_body_bytes"]:
        values["max_body_bytes"] = None
    return RequestLimits(**values)


class RequestClock:
    """One connection's deadlines for the request it is receiving, and its one lazy timer.

    Kept by every :class:`~kubeserve.runtime.http_connection.ServerConnection` (the proxy's client
    connections and the replica server's). Only a read
    that ends inside a request (:meth:`partial`) looks at the clock: a whole request in one read,
    the fast path, never does. The timer is re-armed for the nearest deadline instead of being
    cancelled and created per request; the connection's ``tick`` callback asks :meth:`overdue`
    and re-arms with :meth:`arm`. All times are the event loop's (``loop.time()``).

    Invariant: ``head_bytes`` counts the bytes of reads that ended inside the current head (0
    between heads; the owner resets it when a head completes), ``head_since`` is when the first
    of them arrived, ``body_seen`` when the last read ending inside a body arrived.
    """

    __slots__ = (
        "_loop",
        "_tick",
        "body_seen",
        "due",
        "head_bytes",
        "head_since",
        "limits",
        "timer",
    )

    def __init__(
        self, limits: RequestLimits, loop: asyncio.AbstractEventLoop, tick: Callable[[], None]
    ) -> None:
        self.limits = limits
        self._loop = loop
        self._tick = tick
        self.head_bytes = 0
        self.head_since = 0.0
        self.body_seen = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0

    def arm(self, within_s: float, now: float | None = None) -> None:
        """Make the timer fire within ``within_s`` (re-armed only when it would fire later)."""
        due = (self._loop.time() if now is None else now) + within_s
        if self.timer is not None:
            if self.due <= due:
                return
            self.timer.cancel()
        self.due = due
        self.timer = self._loop.call_at(due, self._tick)

    def fired(self) -> None:
        """Called first by the tick callback: the timer is spent."""
        self.timer = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def partial(self, head_done: bool, read_size: int) -> bool:
        """A read of ``read_size`` bytes ended inside a request (in its head unless
        ``head_done``). False when the head is now larger than ``max_header_bytes``: what an
        unterminated head can make a connection buffer stays bounded by it."""
        now = self._loop.time()
        limits = self.limits
        if not head_done:
            if not self.head_bytes:
                self.head_since = now
            self.head_bytes += read_size
            if self.head_bytes > limits.max_header_bytes:
                return False
            self.arm(limits.header_timeout_s, now)
        else:
            self.body_seen = now
            self.arm(limits.body_timeout_s, now)
        return True

    def head_may_be_too_large(self, read_size: int) -> bool:
        """At the end of a head that arrived partly in the current read of ``read_size`` bytes:
        whether it may exceed the limit (the caller then measures it). Resets the head count."""
        if self.head_bytes:
            read_size += self.head_bytes
            self.head_bytes = 0
        return read_size > self.limits.max_header_bytes

    def overdue(self, head_done: bool, reading: bool, now: float) -> tuple[float, str]:
        """Seconds left for the request being received (<= 0: overdue) and the part that is late,
        ``"head"`` or ``"body"``. While ``reading`` is paused by the server itself
        (backpressure) the client is not late: the clocks restart."""
        if not reading:
            self.head_since = self.body_seen = now
        if not head_done:
            return self.head_since + self.limits.header_timeout_s - now, "head"
        return self.body_seen + self.limits.body_timeout_s - now, "body"
