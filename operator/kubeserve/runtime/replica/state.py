"""What a replica's ingress and control sides share: the user's code and the request accounting.

:class:`ReplicaState` owns ``ongoing``/``processed`` (only touched on the event loop), their
integral over time, ``draining`` and the admission rule: a request is started only while the
replica is not draining and below ``max_ongoing_requests``, enforced here for every caller together
(each caller's router caps only its own). A refused request was not started, so its caller may send
it elsewhere (:data:`~kubeserve.runtime.wire.UNSERVED_HEADER`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from kubeserve.runtime import logs, wire
from kubeserve.runtime.logs import ACCESS_LOGGER, access_message
from kubeserve.runtime.metrics import LATENCY_BUCKETS_MS, ReplicaMetrics, label_value
from kubeserve.runtime.replica.http import HttpResponse, StreamedResponse
from kubeserve.runtime.replica.tally import new_tally
from kubeserve.runtime.replica.user_code import UserCode, invoke, invoke_on_loop
from kubeserve.sdk import context, multiplex

__all__ = ["ReplicaState", "shutting_down"]

log = logging.getLogger("kubeserve.replica")
_access_log = logging.getLogger(ACCESS_LOGGER)
#: marks an access line written as a record (it goes where access lines go)
_ACCESS_RECORD = {logs.ACCESS_RECORD: True}


class ReplicaState:
    """The user's code, how it is run, and the accounting of what runs (see the module)."""

    def __init__(
        self, config: wire.ReplicaConfig, user: UserCode, *, sync_in_threadpool: bool = True
    ) -> None:
        self.config = config
        # Sync user methods run on worker threads unless RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0
        self.run = invoke if sync_in_threadpool else invoke_on_loop
        self.user = user
        self._ongoing = 0
        #: the integral of ``ongoing`` over time up to ``_changed_at`` (request-seconds): the
        #: autoscaler reads its growth to get the mean load between two of its reads. Times are
        #: ``time.perf_counter()``'s (the clock of a request's ``started``: one read per change)
        self._ongoing_area = 0.0
        self._changed_at = self._started_at = time.perf_counter()
        self.processed = 0
        self._max_ongoing = int(config["max_ongoing_requests"])
        self.draining = False
        labels = {
            "app": config["app"],
            "deployment": config["deployment"],
            "replica": config["replica_id"],
        }
        self._labels = ",".join(f'{k}="{label_value(v)}"' for k, v in labels.items())
        #: Ray's ``logging_config.enable_access_log``: an access line per request and call
        self.access_log = True
        #: finished requests' metrics and access lines until the next :meth:`flush`
        self._tally = new_tally(LATENCY_BUCKETS_MS)
        #: the access log whose format the tally's lines are formatted in
        self._lines_for: logs.AccessLog | None = None
        self._flush_scheduled = False
        #: Ray Serve's replica metrics (requests, errors, latency, queries in flight, starts)
        self.metrics_recorder = ReplicaMetrics(
            config["app"],
            config["deployment"],
            config["replica_id"],
            lambda: self._ongoing,
            self._tally.take_metrics,
        )
        #: the :data:`~kubeserve.runtime.wire.MODELS_HEADER` value, and the
        #: :func:`~kubeserve.sdk.multiplex.models_version` it was formatted at
        self._models_value = ""
        self._models_version = -1

    @property
    def ongoing(self) -> int:
        return self._ongoing

    @ongoing.setter
    def ongoing(self, value: int) -> None:
        self._move(value - self._ongoing)

    def _move(self, by: int) -> float:
        """``ongoing`` changes by ``by``: its integral so far is taken first; returns now."""
        now = time.perf_counter()
        ongoing = self._ongoing
        self._ongoing_area += ongoing * (now - self._changed_at)
        self._changed_at, self._ongoing = now, ongoing + by
        if not self._flush_scheduled:
            self._schedule_flush()
        return now

    def begin(self) -> float:
        """A request or handle call starts (admitted by :meth:`refusal`): counted as ongoing
        until :meth:`finish`; returns its start (``perf_counter``), which ``finish`` takes."""
        return self._move(1)

    def admit(self) -> float | None:
        """:meth:`begin` when :meth:`refusal` has no answer, else None (then ask it): the two
        in one call, for the path of every request (``_move`` written out, as in :meth:`finish`)."""
        ongoing = self._ongoing
        if self.draining or ongoing >= self._max_ongoing:
            return None
        now = time.perf_counter()
        self._ongoing_area += ongoing * (now - self._changed_at)
        self._changed_at, self._ongoing = now, ongoing + 1
        if not self._flush_scheduled:
            self._schedule_flush()
        return now

    def _schedule_flush(self) -> None:
        """Flush what the tally holds and the queries in flight :data:`~kubeserve.runtime.
        logs.ACCESS_FLUSH_S` from now (at once without a running loop)."""
        self._flush_scheduled = True
        try:
            asyncio.get_running_loop().call_later(logs.ACCESS_FLUSH_S, self.flush)
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        """The finished requests' metrics into their series (and the queries in flight into
        theirs), their access lines into the log; idempotent."""
        self._flush_scheduled = False
        self.metrics_recorder.flush()
        batched = logs.batched_access()
        if batched is not None:
            batched.write_tally(self._tally)

    def refusal(self) -> HttpResponse | None:
        """The answer to a request that must not start now (draining, or at
        ``max_ongoing_requests``), or None when it may."""
        if self.draining:
            return shutting_down()
        if self._ongoing >= self._max_ongoing:
            return _at_capacity()
        return None

    def finish(
        self,
        started: float,
        route: str,
        method: str | None = None,
        access_route: str = "",
        status: int | str = 0,
        request_id: str | None = None,
    ) -> None:
        """A request or handle call that began at ``started`` (``perf_counter``) is done, its
        metrics counted under ``route``. With ``method``: its access line (Ray's ``GET /route
        200 1.2ms``, or ``CALL method OK``: ``method``, ``access_route``, ``status``), unless
        ``logging_config.enable_access_log`` is off; ``request_id`` (and ``route`` as the
        line's route field) when the caller knows them, else the request context's."""
        now = time.perf_counter()  # self._move(-1), written out: once per request
        ongoing = self._ongoing
        self._ongoing_area += ongoing * (now - self._changed_at)
        self._changed_at, self._ongoing = now, ongoing - 1
        if not self._flush_scheduled:
            self._schedule_flush()
        self.processed += 1
        if method is None or not self.access_log:
            self._tally.done(started, now, route)
            return
        batched = logs.batched_access()
        if batched is None:  # access lines as log records (additional_log_standard_attrs)
            self._tally.done(started, now, route)
            latency_ms = (now - started) * 1000.0
            message = access_message(method, access_route, status, latency_ms)
            _access_log.info(message, extra=_ACCESS_RECORD)
            return
        if batched is not self._lines_for:  # the first line, or the log was configured again
            self._lines_for = batched
            line_format = batched.native_format()
            self._tally.access_format(line_format["json"], line_format["component"])
        if request_id is not None:
            field = route
        else:
            current = context.request_context.get()
            if current is None:
                request_id, field = "", route
            else:
                request_id, field = current.request_id, current.route or route
        self._tally.done(started, now, route, method, access_route, status, request_id, field)

    def ongoing_area(self) -> float:
        """Request-seconds served so far (the integral of ``ongoing``), up to now."""
        return self._ongoing_area + self._ongoing * (time.perf_counter() - self._changed_at)

    def tell_models(self, response: HttpResponse | StreamedResponse) -> None:
        """Name the models this replica holds in the answer to a multiplexed request, so that its
        caller routes the next requests for them here (:data:`~kubeserve.runtime.wire.
        MODELS_HEADER`; formatted again only when the loaded models changed)."""
        version = multiplex.models_version()
        if version != self._models_version:
            self._models_version = version
            self._models_value = wire.encode_models(multiplex.loaded_model_ids())
        if self._models_value:
            # a new dict: a streamed response's headers may be the user's own object
            response.headers = {**response.headers, wire.MODELS_HEADER: self._models_value}

    def metrics(self) -> str:
        """The Prometheus exposition the autoscaler and ``kubeserve status`` read."""
        labels = self._labels
        uptime = time.perf_counter() - self._started_at
        return (
            "# HELP kubeserve_replica_ongoing_requests Requests and handle calls in flight.\n"
            "# TYPE kubeserve_replica_ongoing_requests gauge\n"
            f"kubeserve_replica_ongoing_requests{{{labels}}} {self.ongoing}\n"
            "# HELP kubeserve_replica_ongoing_request_seconds_total Integral of the ongoing "
            "requests over time.\n"
            "# TYPE kubeserve_replica_ongoing_request_seconds_total counter\n"
            f"kubeserve_replica_ongoing_request_seconds_total{{{labels}}} {self.ongoing_area()}\n"
            "# HELP kubeserve_replica_uptime_seconds Time since the replica started serving.\n"
            "# TYPE kubeserve_replica_uptime_seconds counter\n"
            f"kubeserve_replica_uptime_seconds{{{labels}}} {uptime}\n"
            "# HELP kubeserve_replica_processed_requests_total Requests and handle calls done.\n"
            "# TYPE kubeserve_replica_processed_requests_total counter\n"
            f"kubeserve_replica_processed_requests_total{{{labels}}} {self.processed}\n"
            "# HELP kubeserve_replica_max_ongoing_requests Configured cap on requests in flight.\n"
            "# TYPE kubeserve_replica_max_ongoing_requests gauge\n"
            f"kubeserve_replica_max_ongoing_requests{{{labels}}} "
            f"{self.config['max_ongoing_requests']}\n"
        )

    async def drain(self) -> None:
        """Wait for requests in flight, polling every ``graceful_shutdown_wait_loop_s``, at most
        ``graceful_shutdown_timeout_s``; ``draining`` must already be set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config["graceful_shutdown_timeout_s"]
        period = max(self.config["graceful_shutdown_wait_loop_s"], 0.01)
        while self.ongoing and loop.time() < deadline:  # noqa: ASYNC110 - the period is the contract
            await asyncio.sleep(min(period, max(deadline - loop.time(), 0.0)))
        if self.ongoing:
            log.warning("graceful shutdown timed out with %d requests in flight", self.ongoing)


def shutting_down() -> HttpResponse:
    """The answer to a request that arrives while draining: not started, so callers may retry it
    elsewhere (:data:`~kubeserve.runtime.wire.UNSERVED_HEADER`)."""
    headers = {wire.UNSERVED_HEADER: "shutting-down"}
    return HttpResponse(503, b"replica is shutting down", headers, close=True)


def _at_capacity() -> HttpResponse:
    """The answer to a request over ``max_ongoing_requests``: not started, the caller tries
    again (:data:`~kubeserve.runtime.wire.UNSERVED_AT_CAPACITY`)."""
    headers = {wire.UNSERVED_HEADER: wire.UNSERVED_AT_CAPACITY}
    return HttpResponse(503, b"replica is at max_ongoing_requests", headers)
