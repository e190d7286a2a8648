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
  most this long. (A connection that sends nothing at all is closed by the keep-alive timeout.)
* ``body_timeout_s`` 20 s without a single body byte while a request body is incomplete, then 408,
  close, and the replica slot the request held is released. nginx's ``client_body_timeout``
  (60 s) measures the same inactivity; 20 s (Apache's ``body=20``) is shorter than the 30 s a
  request waits for a replica slot, so stalled uploads cannot starve every other request of slots.
  Time spent with reading paused by backpressure (the replica reads slowly) never counts.
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

Invariant: every field is positive (``max_body_bytes`` may be ``None``); :meth:`from_mapping`
rejects anything else with a message naming the field.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["RequestLimits", "add_limit_arguments", "limits_from_arguments"]


@dataclass(frozen=True)
class RequestLimits:
    """Timeouts and sizes a client request must stay within (see the module docstring)."""

    header_timeout_s: float = 20.0
    body_timeout_s: float = 20.0
    max_url_bytes: int = 8 * 1024
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int | None = 100 * 1024 * 1024

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
    "max_url_bytes": "longest request target, else 414 (default %(default)s)",
    "max_header_bytes": "largest request head, else 431 (default %(default)s)",
    "max_body_bytes": "largest request body, else 413; 0: no limit (default %(default)s)",
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
