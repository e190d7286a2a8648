"""What a replica's finished requests leave for its metrics and its access log, taken in batches.

A request's end is one :meth:`Tally.done` call: its latency goes into the count, sum and
histogram bucket of its route, its access line's fields into a buffer; nothing is formatted or
written then. :class:`~kubeserve.runtime.replica.state.ReplicaState` takes both every
:data:`~kubeserve.runtime.logs.ACCESS_FLUSH_S` (into the metric series and the log).

``kubeserve._native.Tally`` (native/pyext/src/tally.rs) is the same in compiled code, where a
request's end allocates no Python object; this module is its pure Python twin (the fallback, and
the reference the tests compare it with): same values, same lines.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from kubeserve.runtime.logs import text_lines
from kubeserve.runtime.native_module import NATIVE

__all__ = ["MetricsBatch", "PyTally", "new_tally"]

#: ``(route, count, total_ms, buckets)``: a route's requests since the last take, ``buckets``
#: one count per latency bound and then +Inf.
MetricsBatch = tuple[str, int, float, list[int]]


class PyTally:
    """The pure Python tally; ``kubeserve._native.Tally`` has the same methods (see the
    module)."""

    __slots__ = ("_bounds", "_dirty", "_entries", "_pending")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._pending: dict[str, list[Any]] = {}  # route -> [count, total_ms, buckets]
        self._entries: list[tuple[float, str, str, int | str, float, str, str]] = []
        self._dirty = False

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
    ) -> bool:
        """A request or handle call that began at ``started`` ended at ``now`` (both
        ``time.perf_counter()``), counted under ``route``; with ``method``, its access line.
        Returns whether this is the first record since the last take."""
        latency_ms = (now - started) * 1000.0
        pending = self._pending.get(route)
        if pending is None:
            pending = self._pending[route] = [0, 0.0, [0] * (len(self._bounds) + 1)]
        pending[0] += 1
        pending[1] += latency_ms
        pending[2][bisect_left(self._bounds, latency_ms)] += 1
        if method is not None:
            entry = (time.time(), method, access_route, status, latency_ms, request_id, route_field)
            self._entries.append(entry)  # type: ignore[arg-type]
        first = not self._dirty
        self._dirty = True
        return first

    def take_metrics(self) -> list[MetricsBatch]:
        self._dirty = False
        batches, self._pending = self._pending, {}
        return [(route, p[0], p[1], p[2]) for route, p in batches.items()]

    def lines(self) -> int:
        return len(self._entries)

    def take_text(self, stamp: Callable[[int], str], who: str) -> str:
        """TEXT lines ``<stamp>,<ms><who><request id> -- <message>`` in one string (``who`` is
        `` <component> <id> ``; ``stamp(second)`` gives ``INFO <asctime without ms>``): the
        access log's own formatter (:func:`kubeserve.runtime.logs.text_lines`)."""
        entries, self._entries = self._entries, []
        return "".join(text_lines(entries, stamp, who))  # type: ignore[arg-type]

    def take_entries(self) -> list[tuple[float, str, str, int | str, float, str, str]]:
        entries, self._entries = self._entries, []
        return entries


def new_tally(bounds: Sequence[float]) -> PyTally:
    """The compiled tally where ``kubeserve._native`` has one, else :class:`PyTally` (typed as
    the latter: the same methods)."""
    native = getattr(NATIVE, "Tally", None)
    if native is None:
        return PyTally(bounds)
    tally: PyTally = native(list(bounds))
    return tally
