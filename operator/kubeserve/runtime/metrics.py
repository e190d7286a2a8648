"""Prometheus metrics of proxies and replicas, with Ray Serve's names, labels and buckets.

Existing Grafana dashboards for Ray Serve read ``ray_serve_num_http_requests_total``,
``ray_serve_http_request_latency_ms_bucket``, ``ray_serve_deployment_request_counter_total``... by
``application``, ``deployment``, ``replica`` and ``route``: the same series come out of kubeserve,
written in prometheus_client's formats (Ray's counters gain the ``_total`` suffix the same way).
A proxy serving gRPC adds Ray's gRPC series (``ray_serve_num_grpc_requests_total``,
``ray_serve_grpc_request_latency_ms_bucket``...: :class:`GrpcProxyMetrics`).

Besides Ray's series, ``kubeserve_log_lines_dropped_total`` (by ``component``: ``proxy``,
``replica``, ``controller``) counts log lines a process could not write (a full disk; see
:mod:`kubeserve.runtime.logs`).

They are written with :mod:`kubeserve.runtime.prometheus` (the proxy and replicas never load
prometheus_client; the controller's merge does, :mod:`kubeserve.runtime.metrics_merge`).

Where they are read:

* ``kubeserve start``: every process of the instance writes its samples to files under
  ``PROMETHEUS_MULTIPROC_DIR`` (in ``/dev/shm``, off the state directory's disk; set by the
  controller for the proxy and the replicas it starts; prometheus_client's multiprocess files),
  and the admin API's ``GET /metrics`` merges them (:mod:`~kubeserve.runtime.metrics_merge`).
  Files of
  replicas that exited keep their counters (totals never go backwards); their gauges are dropped.
* Kubernetes: each proxy and replica pod serves its own samples on the metrics port
  (:mod:`kubeserve.runtime.metrics_listener`).

The hot path stays in plain Python: a request adds to a :class:`_Pending` of its label set (a
count, a latency sum and a bucket index found by bisection), and every :data:`FLUSH_INTERVAL_S`
the batches go into the metric objects, one write per label set and bucket instead of five per
request (in multiprocess mode each write is a locked write to a memory-mapped file). Ray Serve's
replicas batch the same way. A scrape sees requests at most that much late; nothing is formatted
until a scrape. A kubeserve replica counts its requests in its tally instead
(:mod:`kubeserve.runtime.replica.tally`, compiled where ``kubeserve._native`` is built), taken
into :class:`ReplicaMetrics` every 0.1 s with its access lines.

Bounded by construction (a scan of random paths once grew a proxy by hundreds of MiB and its
scrape to tens of MB, then the merged scrape took ``kubeserve start`` down with it):

* label values come from configuration (application, deployment, replica, route prefix) or from
  small fixed tables (:data:`METHOD_LABELS`, the proxy's own endpoints), never from a request:
  a request no route matches is labelled ``route=""`` as in Ray's proxy, whatever its path;
* and whatever a future label carries, a metric holds at most :data:`MAX_SERIES_PER_METRIC`
  series in a process: further label sets all write to one series whose every label is
  :data:`OVERFLOW`, and each such write counts in ``kubeserve_metric_series_overflow_total``.
"""

from __future__ import annotations

import asyncio
import os
import socket
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from kubeserve.runtime import logs
from kubeserve.runtime.prometheus import (
    MULTIPROC_ENV,
    Counter,
    Gauge,
    Histogram,
    label_value,
    process_registry,
)

__all__ = [
    "LATENCY_BUCKETS_MS",
    "LOG_LINES_DROPPED",
    "MAX_SERIES_PER_METRIC",
    "METHOD_LABELS",
    "MULTIPROC_ENV",
    "OTHER_METHOD",
    "OVERFLOW",
    "GrpcProxyMetrics",
    "ProxyMetrics",
    "ReplicaMetrics",
    "exposition",
    "label_value",
    "metric_family",
]

#: How long recorded requests wait in the process before they reach the metric objects.
FLUSH_INTERVAL_S = 0.5

#: Ray Serve's ``DEFAULT_LATENCY_BUCKET_MS``: request latencies from 1 ms to 10 minutes.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000, 60000, 120000, 300000,
    600000,
)  # fmt: skip


#: The series one metric may hold in a process; further label sets go to its overflow series.
MAX_SERIES_PER_METRIC = 1000

#: Every label value of a metric's overflow series.
OVERFLOW = "__overflow__"

#: The ``method`` label of a request method (as the HTTP parser gives it); any other method is
#: :data:`OTHER_METHOD`. ``WEBSOCKET`` is how Ray's proxy labels a WebSocket.
METHOD_LABELS: dict[bytes, str] = {
    m.encode(): m
    for m in (
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
        "WEBSOCKET",
    )
}  # fmt: skip
OTHER_METHOD = "OTHER"

#: The counter of log lines a process could not write (the family's name; samples end ``_total``).
LOG_LINES_DROPPED = "kubeserve_log_lines_dropped"
LOG_LINES_DROPPED_DOC = "Log lines a process could not write (a full disk, say) and dropped."


class _Children:
    """The labelled children of one metric, cached by their label values, at most
    :data:`MAX_SERIES_PER_METRIC` of them (then the :data:`OVERFLOW` one)."""

    __slots__ = ("_cache", "_metric", "_name", "_overflow")

    def __init__(self, metric: Any, name: str) -> None:
        self._metric = metric
        self._name = name
        self._cache: dict[tuple[str, ...], Any] = {}
        self._overflow: Any = None

    def get(self, *values: str) -> Any:
        child = self._cache.get(values)
        if child is None:
            if len(self._cache) < MAX_SERIES_PER_METRIC:
                child = self._cache[values] = self._metric.labels(*values)
            else:
                child = self._overflowed()
        return child

    def _overflowed(self) -> Any:
        if self._overflow is None:
            self._overflow = self._metric.labels(*(OVERFLOW for _ in self._metric.labelnames))
        _overflow_writes().get(self._name).inc()
        return self._overflow


#: Metric families of this process by name: created once, shared by every proxy state and
#: replica object of the process (a second registration of a name is an error), and so is
#: their bound.
_FAMILIES: dict[str, _Children] = {}


def _family(
    kind: Any, name: str, documentation: str, labels: tuple[str, ...], **kw: Any
) -> _Children:
    family = _FAMILIES.get(name)
    if family is None:
        family = _FAMILIES[name] = _Children(kind(name, documentation, labels, **kw), name)
    return family


def metric_family(
    kind: Any, name: str, documentation: str, labels: tuple[str, ...], **kw: Any
) -> _Children:
    """A metric family of this process by ``name`` (a :mod:`~kubeserve.runtime.prometheus`
    ``kind``), bounded
    as every family here; its ``get(*label_values)`` is the labelled child to write. Created
    once: a second call with other labels is a :class:`ValueError` (user code's metrics)."""
    family = _family(kind, name, documentation, labels, **kw)
    known = family._metric
    if not isinstance(known, kind) or known.labelnames != labels:
        raise ValueError(
            f"metric {name} is already defined as a {type(known).__name__} with tags "
            f"{known.labelnames}, not a {kind.__name__} with tags {labels}"
        )
    return family


def _overflow_writes() -> _Children:
    return _family(
        Counter,
        "kubeserve_metric_series_overflow",
        f"Writes to a metric's overflow series (label sets beyond {MAX_SERIES_PER_METRIC}).",
        ("metric",),
    )


class _Pending:
    """Requests of one label set since the last flush: count, latency sum and histogram."""

    __slots__ = ("buckets", "count", "total_ms")

    def __init__(self) -> None:
        self.count = 0
        self.total_ms = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)  # the last one is +Inf

    def add(self, latency_ms: float) -> None:
        self.count += 1
        self.total_ms += latency_ms
        self.buckets[bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1

    def add_counted(self, count: int, total_ms: float, buckets: list[int]) -> None:
        """Requests counted elsewhere (the native data path): ``buckets`` per
        :data:`LATENCY_BUCKETS_MS` bucket, then +Inf."""
        if len(buckets) != len(self.buckets):
            raise ValueError(f"{len(buckets)} latency buckets, not {len(self.buckets)}")
        self.count += count
        self.total_ms += total_ms
        for i, n in enumerate(buckets):
            self.buckets[i] += n

    def observe_into(self, histogram: Any) -> None:
        """Add the batch to a labelled histogram series: its sum and each bucket's count."""
        histogram.add(self.total_ms, self.buckets)


class _Batcher:
    """Flushes what was recorded, :data:`FLUSH_INTERVAL_S` after the first record of a batch."""

    def __init__(self) -> None:
        self._scheduled = False

    def _schedule(self) -> None:
        if self._scheduled:
            return
        self._scheduled = True
        try:
            asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self._flush_now)
        except RuntimeError:  # no event loop: at once
            self._flush_now()

    def _flush_now(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        raise NotImplementedError


class _IngressFamilies:
    """Ray's ``RequestIngressMetrics`` of one protocol (``http`` or ``grpc``): requests, errors,
    errors by deployment, latency, and this process's ongoing-requests child."""

    def __init__(self, protocol: str, shown: str, node_id: str) -> None:
        self.requests = _family(
            Counter,
            f"ray_serve_num_{protocol}_requests",
            f"The number of {shown} requests processed.",
            ("route", "method", "application", "status_code"),
        )
        self.errors = _family(
            Counter,
            f"ray_serve_num_{protocol}_error_requests",
            f"The number of errored {shown} responses.",
            ("route", "error_code", "method", "application"),
        )
        self.deployment_errors = _family(
            Counter,
            f"ray_serve_num_deployment_{protocol}_error_requests",
            f"The number of errored {shown} responses returned by each deployment.",
            ("deployment", "error_code", "method", "route", "application"),
        )
        self.latency = _family(
            Histogram,
            f"ray_serve_{protocol}_request_latency_ms",
            f"The end-to-end latency of {shown} requests (measured from the Serve {shown} proxy).",
            ("method", "route", "application", "status_code"),
            buckets=LATENCY_BUCKETS_MS,
        )
        node = node_id or socket.gethostname()
        self.ongoing = _family(
            Gauge,
            f"ray_serve_num_ongoing_{protocol}_requests",
            f"The number of ongoing requests in this {shown} proxy.",
            ("node_id", "node_ip_address"),
            multiprocess_mode="livesum",
        ).get(node, os.environ.get("KUBESERVE_POD_IP", "127.0.0.1"))

    def add(
        self,
        key: tuple[str, str, str, str, str],
        pending: _Pending,
        error: bool,
    ) -> None:
        """One batch of requests of label set ``key`` (method, route, application, deployment,
        status code)."""
        method, route, application, deployment, code = key
        n = pending.count
        self.requests.get(route, method, application, code).inc(n)
        pending.observe_into(self.latency.get(method, route, application, code))
        if error:
            self.errors.get(route, code, method, application).inc(n)
            self.deployment_errors.get(deployment, code, method, route, application).inc(n)


class ProxyMetrics(_Batcher):
    """What Ray Serve's HTTP proxy records, per request, from the proxy's point of view."""

    def __init__(self, node_id: str = "") -> None:
        super().__init__()
        count_dropped_log_lines("proxy")
        #: requests begun and not answered yet (the ``ray_serve_num_ongoing_http_requests``)
        self.in_flight = 0
        #: requests in flight that another process in front counts (:meth:`set_elsewhere`)
        self.elsewhere = 0
        self._pending: dict[tuple[str, str, str, str, int], _Pending] = {}
        self._families = _IngressFamilies("http", "HTTP", node_id)
        self.ongoing = self._families.ongoing

    def record(
        self,
        method: str,
        route: str,
        application: str,
        deployment: str,
        status: int,
        latency_ms: float,
    ) -> None:
        """One answered request (``route``: the application's route prefix, or the path of
        the proxy's own endpoints; empty names when no route matched)."""
        key = (method, route, application, deployment, status)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending()
        # _Pending.add and _schedule's test, inlined: on every request of the proxy
        pending.count += 1
        pending.total_ms += latency_ms
        pending.buckets[bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1
        if not self._scheduled:
            self._schedule()

    def add_batch(
        self,
        labels: tuple[str, str, str, str, int],
        count: int,
        total_ms: float,
        buckets: list[int],
    ) -> None:
        """Requests counted elsewhere (the native data path, :mod:`~kubeserve.runtime.fastpath`):
        ``labels`` as :meth:`record` takes them, ``buckets`` per :data:`LATENCY_BUCKETS_MS`
        bucket, then +Inf."""
        pending = self._pending.get(labels)
        if pending is None:
            pending = self._pending[labels] = _Pending()
        pending.add_counted(count, total_ms, buckets)
        if not self._scheduled:
            self._schedule()

    def flush(self) -> None:
        batches, self._pending = self._pending, {}
        add = self._families.add
        for (method, route, application, deployment, status), pending in batches.items():
            add((method, route, application, deployment, str(status)), pending, status >= 400)
        self.ongoing.set(self.in_flight + self.elsewhere)

    def set_elsewhere(self, in_flight: int) -> None:
        """The requests the native data path (:mod:`~kubeserve.runtime.fastpath`) has in flight
        now: part of the ongoing-requests gauge from the next flush."""
        if in_flight != self.elsewhere:
            self.elsewhere = in_flight
            self._schedule()


class GrpcProxyMetrics(_Batcher):
    """What Ray Serve's gRPC proxy records per call: the HTTP proxy's series named ``grpc``,
    labelled with the full method (``/pkg.Service/Method``), the application as the route (the
    method for the built-in ``RayServeAPIService``, "" for an unknown application), and the
    status code's name; an error is a call that did not end OK."""

    def __init__(self, node_id: str = "") -> None:
        super().__init__()
        #: calls begun and not answered yet (``ray_serve_num_ongoing_grpc_requests``)
        self.in_flight = 0
        self._pending: dict[tuple[str, str, str, str, str], tuple[_Pending, bool]] = {}
        self._families = _IngressFamilies("grpc", "gRPC", node_id)

    def record(
        self,
        method: str,
        route: str,
        application: str,
        deployment: str,
        code: str,
        error: bool,
        latency_ms: float,
    ) -> None:
        """One answered call (``route``: Ray's, the application's name for a routed call)."""
        key = (method, route, application, deployment, code)
        batch = self._pending.get(key)
        if batch is None:
            batch = self._pending[key] = (_Pending(), error)
        batch[0].add(latency_ms)
        self._schedule()

    def add_batch(
        self,
        labels: tuple[str, str, str, str, str],
        count: int,
        total_ms: float,
        buckets: list[int],
    ) -> None:
        """Calls counted by the native gRPC front (:mod:`~kubeserve.runtime.fastpath`):
        ``labels`` as :meth:`record` takes them, ``buckets`` per :data:`LATENCY_BUCKETS_MS`
        bucket, then +Inf."""
        batch = self._pending.get(labels)
        if batch is None:
            batch = self._pending[labels] = (_Pending(), labels[4] != "OK")
        batch[0].add_counted(count, total_ms, buckets)
        self._schedule()

    def flush(self) -> None:
        batches, self._pending = self._pending, {}
        add = self._families.add
        for key, (pending, error) in batches.items():
            add(key, pending, error)
        self._families.ongoing.set(self.in_flight)


class ReplicaMetrics(_Batcher):
    """What a Ray Serve replica records: requests, errors, latency, queries in flight, starts."""

    def __init__(
        self,
        application: str,
        deployment: str,
        replica: str,
        processing: Callable[[], int],
        batches: Callable[[], list[tuple[str, int, float, list[int]]]],
    ) -> None:
        """``processing``: the replica's queries in flight now (read at each flush);
        ``batches``: the requests and handle calls finished since the last flush, counted by
        the replica's tally (``(route, count, total_ms, buckets)``,
        :mod:`kubeserve.runtime.replica.tally`), taken at each flush."""
        super().__init__()
        count_dropped_log_lines("replica")
        self._processing_now = processing
        self._batches = batches
        who = ("application", "deployment", "replica")
        self._who = (application, deployment, replica)
        self.requests = _family(
            Counter,
            "ray_serve_deployment_request_counter",
            "The number of queries that have been processed in this replica.",
            (*who, "route"),
        )
        self.errors = _family(
            Counter,
            "ray_serve_deployment_error_counter",
            "The number of exceptions that have occurred in this replica.",
            (*who, "route", "exception_type"),
        )
        self.latency = _family(
            Histogram,
            "ray_serve_deployment_processing_latency_ms",
            "The latency for queries to be processed.",
            (*who, "route"),
            buckets=LATENCY_BUCKETS_MS,
        )
        self.processing = _family(
            Gauge,
            "ray_serve_replica_processing_queries",
            "The current number of queries being processed.",
            who,
            multiprocess_mode="livesum",
        ).get(*self._who)
        _family(
            Counter,
            "ray_serve_deployment_replica_starts",
            "The number of times this replica has been restarted due to failure.",
            who,
        ).get(*self._who).inc()

    def changed(self) -> None:
        """The queries in flight changed (a request began or ended): flush them soon."""
        self._schedule()

    def flush(self) -> None:
        for route, count, total_ms, buckets in self._batches():
            self.requests.get(*self._who, route).inc(count)
            self.latency.get(*self._who, route).add(total_ms, buckets)
        self.processing.set(self._processing_now())

    def error(self, route: str, exception: BaseException) -> None:
        """The user code raised ``exception`` for a request or handle call."""
        self.errors.get(*self._who, route, type(exception).__name__).inc()


def count_dropped_log_lines(component: str) -> None:
    """Count this process's dropped log lines (:func:`logs.dropped_lines`) in
    ``kubeserve_log_lines_dropped_total{component=...}``, from now on; once per process."""
    if LOG_LINES_DROPPED in _FAMILIES:
        return
    counter = _family(Counter, LOG_LINES_DROPPED, LOG_LINES_DROPPED_DOC, ("component",))
    child = counter.get(component)
    child.inc(0)  # the series exists (at 0) before the first drop
    logs.on_dropped(child.inc)


def exposition() -> bytes:
    """The Prometheus text exposition of this process's metrics."""
    return process_registry().exposition()
