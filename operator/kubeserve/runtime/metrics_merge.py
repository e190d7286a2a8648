"""The controller's ``GET /metrics`` of ``kubeserve start``: the multiprocess files every proxy
and replica of the instance writes (:mod:`kubeserve.runtime.prometheus`), merged with
prometheus_client, plus the controller's own dropped log lines.

Only the controller imports this module (and so prometheus_client): the data plane's processes
write the files and never read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.core import CounterMetricFamily

from kubeserve.runtime import logs
from kubeserve.runtime.metrics import LOG_LINES_DROPPED, LOG_LINES_DROPPED_DOC

__all__ = ["mark_process_dead", "multiprocess_exposition"]


class _WithOwnDrops:
    """The samples of a metrics directory plus this process's dropped log lines (the controller,
    which writes none to the directory), in one ``kubeserve_log_lines_dropped`` family."""

    def __init__(self, directory: str) -> None:
        self._inner = _multiprocess.MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Any]:
        own = float(logs.dropped_lines())
        found = False
        for family in self._inner.collect():  # type: ignore[no-untyped-call]
            if family.name == LOG_LINES_DROPPED:
                family.add_sample(f"{LOG_LINES_DROPPED}_total", {"component": "controller"}, own)
                found = True
            yield family
        if not found:
            family = CounterMetricFamily(
                LOG_LINES_DROPPED, LOG_LINES_DROPPED_DOC, labels=["component"]
            )
            family.add_metric(["controller"], own)
            yield family


def multiprocess_exposition(directory: str) -> bytes:
    """The samples every process wrote under ``directory``, merged (the admin API's
    ``GET /metrics`` of ``kubeserve start``)."""
    registry = CollectorRegistry()
    registry.register(_WithOwnDrops(directory))
    return generate_latest(registry)


def mark_process_dead(pid: int, directory: str) -> None:
    """Drop the gauges of an exited process (its counters stay: totals never go backwards)."""
    _multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
