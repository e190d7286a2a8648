"""Ray's ``tracing_config`` in the data plane: OpenTelemetry spans for requests and handle calls.

One trace per request, as Ray 2.60 draws it: the proxy's span (``proxy_http_request``,
``proxy_websocket_request`` or ``proxy_grpc_request``, a child of the client's W3C
``traceparent`` when it sent one; it ends with the response, the socket or the call), the
replica's span for the request or call it runs (``replica_handle_request``, until a streamed
answer's end), and a span per handle call user code makes (``route_to_replica``; the gRPC proxy's
call too), whose callee's replica span is its child. Every span carries the request
id (``request_id``), the application and the deployment. User code runs inside its replica span's
context: ``opentelemetry.trace.get_current_span()`` is that span, spans the user starts are its
children, and handle calls continue the trace.

How the context travels: proxy -> replica in the ``traceparent`` (and ``tracestate``) headers of
the forwarded request, the proxy's own replacing the client's (the replica sees the span that
called it, as W3C trace context means); handle call -> replica in the call's options
(:data:`CALL_OPTION`).

Cost when disabled (the default): :data:`ACTIVE` is None and a request pays one check of it per
hop; this module imports nothing of OpenTelemetry until :func:`setup` is given an enabled config,
so processes that do not trace never load it.

Sampling is Ray's: ``ParentBased(TraceIdRatioBased(sampling_ratio))``, so a client's sampled
``traceparent`` is followed whatever the ratio, a request without one starts a trace with
probability ``sampling_ratio``, and the processes downstream follow the proxy's decision.

``exporter_import_path`` names a function taking no arguments (``module:function`` or
``module.function``) that returns span processors (Ray's contract: a list of
``SpanProcessor``), or span exporters, which are batched (``BatchSpanProcessor``); one or a
list. Empty: spans go as JSON lines to ``spans/<component>_tracing.json`` next to the process's
log file (Ray's default exporter writes its serve logs directory's ``spans/``), or to stderr
when it logs there (a pod).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeserve.runtime.tracer import Tracer

__all__ = ["ACTIVE", "CALL_OPTION", "TRACE_HEADERS", "TracingSetupError", "setup"]

#: The process's tracer once :func:`setup` enabled tracing; None: tracing is off (the default).
ACTIVE: Tracer | None = None
#: The handle-call option carrying the caller's trace context (a W3C carrier dict).
CALL_OPTION = "trace"
#: The W3C trace-context headers, lower case.
TRACE_HEADERS = ("traceparent", "tracestate")


class TracingSetupError(Exception):
    """``tracing_config`` cannot be applied in this process (OpenTelemetry missing, an exporter
    that does not import or returns something else); ``field`` is the config's field to blame."""

    def __init__(self, reason: str, field: str = "exporter_import_path") -> None:
        super().__init__(reason)
        self.field = field

    def named(self) -> str:
        """The reason after the field it blames: ``tracing_config.<field>: <reason>``."""
        return f"tracing_config.{self.field}: {self}"


def setup(config: Mapping[str, Any] | None, component: str) -> Tracer | None:
    """Apply ``tracing_config`` to this process once, at start-up: the tracer (also installed as
    OpenTelemetry's global provider, so user code's spans go to the same exporters) or None when
    the config does not enable tracing. Only then is :mod:`kubeserve.runtime.tracer` (and
    OpenTelemetry) imported: this module is all a process that does not trace loads."""
    global ACTIVE
    if not config or not config.get("enabled"):
        return None
    from kubeserve.runtime.tracer import Tracer

    ACTIVE = Tracer(config, component)
    return ACTIVE
