"""What a replica's finished requests leave for its metrics and its access log, taken in batches.

A request's end is one :meth:`Tally.done` call: its latency goes into the count, sum and
histogram bucket of its route, its access line (in the format :meth:`Tally.access_format` gave,
the access log's :meth:`~kubeserve.runtime.logs.AccessLog.native_format`) into a buffer; nothing
is written then. :class:`~kubeserve.runtime.replica.state.ReplicaState` takes both every
:data:`~kubeserve.runtime.logs.ACCESS_FLUSH_S` (into the metric series and the log, where the
lines are one block). At most :data:`~kubeserve.runtime.logs.MAX_ACCESS_LINES` lines wait; past
it they are counted and dropped.

``kubeserve._native.Tally`` (native/pyext/src/tally.rs) is the same in compiled code, where a
request's end allocates no Python object and its line is formatted at once into one reused
buffer, by the proxy's native formatter; this module is its pure Python twin (the fallback, and
the reference the tests compare it with): same values, same lines.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from kubeserve.runtime.logs import MAX_ACCESS_LINES, LineFormat
from kubeserve.runtime.native_module import NATIVE

__all__ = ["MetricsBatch", "PyTally", "new_tally"]

#: ``(route, count, total_ms, buckets)``: a route's requests since the last take, ``buckets``
#: one count per latency bound and then +Inf.
MetricsBatch = tuple[str, int, float, list[int]]


class PyTally:
    """The pure Python tally; ``kubeserve._native.Tally`` has the same methods (see the
    module)."""

    __slots__ = (
        "_bounds",
        "_dirty",
        "_dropped",
        "_entries",
        "_format",
        "_formatted",
        "_pending",
        "_room",
    )

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._pending: dict[str, list[Any]] = {}  # route -> [count, total_ms, buckets]
        #: the lines since the last take: those of an earlier format formatted, then the entries
        self._formatted: list[str] = []
        self._entries: list[tuple[float, str, str, int | str, float, str, str]] = []
        self._format: LineFormat | None = None
        #: how many entries may wait: ``MAX_ACCESS_LINES`` less the lines formatted
        self._room = MAX_ACCESS_LINES
        self._dropped = 0
        self._dirty = False

    def access_format(self, json: bool, component: str) -> None:
        """The format of the access lines from now on (the access log's ``native_format()``);
        until it is given, :meth:`done` keeps no line."""
        if self._format is not None and self._entries:
            entries, self._entries = self._entries, []
            self._formatted += self._format.lines(entries)  # type: ignore[arg-type]
            self._room = MAX_ACCESS_LINES - len(self._formatted)
        self._format = LineFormat(json, component)

    def done(
        self,
        started: float,
        now: float,
        route: str,
        method: str | None = None,
        access_route: str = "",
        status: int | str | None = None,
        request_id: str = "",
        route_field: str = "",
        at: float | None = None,
    ) -> bool:
        """A request or handle call that began at ``started`` ended at ``now`` (both
        ``time.perf_counter()``), counted under ``route``; with ``method``, its access line
        (``at``: when it ended, ``time.time()``, if not now). Returns whether this is the first
        record since the last take."""
        latency_ms = (now - started) * 1000.0
        pending = self._pending.get(route)
        if pending is None:
            pending = self._pending[route] = [0, 0.0, [0] * (len(self._bounds) + 1)]
        pending[0] += 1
        pending[1] += latency_ms
        pending[2][bisect_left(self._bounds, latency_ms)] += 1
        if method is not None and self._format is not None:
            if len(self._entries) < self._room:
                when = time.time() if at is None else at
                entry = (when, method, access_route, status, latency_ms, request_id, route_field)
                self._entries.append(entry)  # type: ignore[arg-type]
            else:
                self._dropped += 1
        first = not self._dirty
        self._dirty = True
        return first

    def take_metrics(self) -> list[MetricsBatch]:
        self._dirty = False
        batches, self._pending = self._pending, {}
        return [(route, p[0], p[1], p[2]) for route, p in batches.items()]

    def lines(self) -> int:
        return len(self._formatted) + len(self._entries)

    def take_lines(self) -> tuple[bytes | str, int]:
        """The waiting access lines in one text, each ending in a newline (the access log's own
        formatter, :class:`kubeserve.runtime.logs.LineFormat`), and how many were dropped since
        the last take."""
        lines, self._formatted = self._formatted, []
        if self._entries and self._format is not None:
            entries, self._entries = self._entries, []
            lines += self._format.lines(entries)  # type: ignore[arg-type]
        dropped, self._dropped, self._room = self._dropped, 0, MAX_ACCESS_LINES
        return "".join(lines), dropped


def new_tally(bounds: Sequence[float]) -> PyTally:
    """The compiled tally where ``kubeserve._native`` has one (built from this tree: one built
    before its tally formatted lines has no ``access_format``), else :class:`PyTally` (typed as
    the latter: the same methods)."""
    native = getattr(NATIVE, "Tally", None)
    if native is None or not hasattr(native, "access_format"):
        return PyTally(bounds)
    tally: PyTally = native(list(bounds))
    return tally
