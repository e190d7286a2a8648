"""Ray's ``tracing_config`` in the data plane: OpenTelemetry spans for requests and handle calls.

One trace per request, as Ray 2.60 draws it: the proxy's span (``proxy_http_request``, a child
of the client's W3C ``traceparent`` when it sent one), the replica's span for the request or call
it runs (``replica_handle_request``), and a span per handle call user code makes
(``route_to_replica``), whose callee's replica span is its child. Every span carries the request
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

import contextlib
import importlib
import importlib.machinery
import inspect
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "ACTIVE",
    "CALL_OPTION",
    "TRACE_HEADERS",
    "Tracer",
    "TracingSetupError",
    "headers_carrier",
    "import_exporter",
    "replica_span_of",
    "setup",
    "unavailable",
]

#: The process's tracer once :func:`setup` enabled tracing; None: tracing is off (the default).
ACTIVE: Tracer | None = None
#: The handle-call option carrying the caller's trace context (a W3C carrier dict).
CALL_OPTION = "trace"
#: The W3C trace-context headers, lower case.
TRACE_HEADERS = ("traceparent", "tracestate")
_INSTRUMENTATION = "kubeserve"
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.#-]+")


class TracingSetupError(Exception):
    """``tracing_config`` cannot be applied in this process (OpenTelemetry missing, an exporter
    that does not import or returns something else)."""


def setup(config: Mapping[str, Any] | None, component: str) -> Tracer | None:
    """Apply ``tracing_config`` to this process once, at start-up: the tracer (also installed as
    OpenTelemetry's global provider, so user code's spans go to the same exporters) or None when
    the config does not enable tracing."""
    global ACTIVE
    if not config or not config.get("enabled"):
        return None
    ACTIVE = Tracer(config, component)
    return ACTIVE


def import_exporter(path: str) -> Any:
    """The function ``exporter_import_path`` names (``module:attr`` or ``module.attr``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise TracingSetupError(f"exporter_import_path {path!r} is not module:function")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # the user's module may raise anything while importing
        raise TracingSetupError(
            f"exporter_import_path {path!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(target):
        raise TracingSetupError(f"exporter_import_path {path!r} is not a function")
    return target


def unavailable(config: Mapping[str, Any] | None, search_path: list[str]) -> tuple[str, str] | None:
    """Why processes with ``search_path`` (their ``sys.path``) could not trace as ``config``
    asks: ``(field, reason)``, or None. Runs nothing of the user's: OpenTelemetry and the
    exporter's top-level package are looked up, not imported (what a submodule or the function
    holds is found when the process imports it)."""
    if not config or not config.get("enabled"):
        return None
    finder = importlib.machinery.PathFinder
    if finder.find_spec("opentelemetry", search_path) is None:
        return "enabled", (
            "tracing needs OpenTelemetry where proxies and replicas run: "
            "pip install 'kubeserve[tracing]'"
        )
    path = str(config.get("exporter_import_path") or "")
    top = path.partition(":")[0].partition(".")[0]
    if top and top not in sys.builtin_module_names and finder.find_spec(top, search_path) is None:
        return "exporter_import_path", (
            f"exporter_import_path {path!r} does not import: no module named {top!r} where "
            "proxies and replicas run"
        )
    return None


class Tracer:
    """This process's OpenTelemetry tracer, and the three kinds of span kubeserve makes."""

    def __init__(self, config: Mapping[str, Any], component: str) -> None:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise TracingSetupError(
                "tracing_config.enabled needs OpenTelemetry in this process: "
                "pip install 'kubeserve[tracing]' (opentelemetry-api, opentelemetry-sdk)"
            ) from exc
        ratio = float(config.get("sampling_ratio", 0.01))
        resource = Resource.create({"service.name": "kubeserve", "kubeserve.component": component})
        provider = TracerProvider(sampler=ParentBasedTraceIdRatio(ratio), resource=resource)
        for processor in _span_processors(str(config.get("exporter_import_path") or ""), component):
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        propagator = TraceContextTextMapPropagator()
        propagate.set_global_textmap(propagator)  # user code's inject()/extract() speak W3C too
        self.provider = provider
        self._trace = trace
        self._context = context
        self._propagator = propagator
        self._tracer = provider.get_tracer(_INSTRUMENTATION)
        self._server = trace.SpanKind.SERVER
        self._client = trace.SpanKind.CLIENT

    # -- the proxy -------------------------------------------------------------------------------

    def proxy_span(
        self, carrier: Mapping[str, str], name: str, attributes: Mapping[str, Any]
    ) -> tuple[Any, dict[str, str]]:
        """A proxied request's span, child of the client's trace context in ``carrier`` (its
        ``traceparent``/``tracestate`` headers, when it sent them), and the headers that carry
        the span on to the replica. End it with :meth:`end`."""
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            name, context=parent, kind=self._server, attributes=_present(attributes)
        )
        return span, self.carrier(span)

    def end(self, span: Any, status: int | None = None, error: BaseException | None = None) -> None:
        """End ``span`` (see :meth:`mark`)."""
        self.mark(span, status, error)
        span.end()

    def mark(
        self, span: Any, status: int | None = None, error: BaseException | None = None
    ) -> None:
        """Note on ``span`` its HTTP status (5xx marks it an error) or the exception raised."""
        if not span.is_recording():
            return
        if status is not None:
            span.set_attribute("http.status_code", status)
        if error is not None:
            span.record_exception(error)
        if error is not None or (status is not None and status >= 500):
            span.set_status(self._trace.StatusCode.ERROR)

    def carrier(self, span: Any) -> dict[str, str]:
        """``span``'s W3C trace-context headers (``traceparent``, and ``tracestate`` when set)."""
        out: dict[str, str] = {}
        self._propagator.inject(out, context=self._trace.set_span_in_context(span))
        return out

    # -- replicas and handle calls ---------------------------------------------------------------

    @contextlib.contextmanager
    def replica_span(
        self, carrier: Mapping[str, str] | None, name: str, attributes: Mapping[str, Any]
    ) -> Iterator[Any]:
        """Run the block (the user's code) inside a replica span, child of the caller's context in
        ``carrier``: ``get_current_span()`` is this span there. An exception escaping the block
        is recorded on it."""
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            name, context=parent, kind=self._server, attributes=_present(attributes)
        )
        with self._active(span):
            try:
                yield span
            except GeneratorExit:  # the caller stopped iterating a stream: not an error
                span.end()
                raise
            except BaseException as exc:
                self.end(span, error=exc)
                raise
        span.end()

    @contextlib.contextmanager
    def handle_span(self, attributes: Mapping[str, Any], name: str) -> Iterator[dict[str, str]]:
        """A handle call's span, child of the current context (the replica span of the request
        making the call); yields the carrier the call sends to its callee."""
        span = self._tracer.start_span(name, kind=self._client, attributes=_present(attributes))
        try:
            yield self.carrier(span)
        except BaseException as exc:
            self.end(span, error=exc)
            raise
        span.end()

    @contextlib.contextmanager
    def _active(self, span: Any) -> Iterator[None]:
        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):  # detached in another context (a moved task)
                self._context.detach(token)


def replica_span_of(
    config: Mapping[str, Any], method: str, request_id: str
) -> tuple[str, dict[str, Any]]:
    """The name and attributes of a replica span (Ray's) for a call of ``method``."""
    name = f"replica_handle_request {config['deployment']} {method}"
    return name, {
        "request_id": request_id,
        "replica_id": config["replica_id"],
        "app": config["app"],
        "deployment": config["deployment"],
        "call_method": method,
    }


def headers_carrier(headers: list[tuple[str, str]]) -> dict[str, str]:
    """The W3C trace-context headers among a request's ``headers``."""
    return {
        name.lower(): value
        for name, value in headers
        if len(name) in (10, 11) and name.lower() in TRACE_HEADERS
    }


def _present(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes without the empty ones (OpenTelemetry warns about None values)."""
    return {k: v for k, v in attributes.items() if v is not None and v != ""}


def _span_processors(path: str, component: str) -> list[Any]:
    """The span processors ``exporter_import_path`` gives (Ray's contract, exporters batched),
    or the default JSON-lines exporter's."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
    )

    if not path:
        return [SimpleSpanProcessor(_default_exporter(component))]
    function = import_exporter(path)
    try:
        if inspect.signature(function).parameters:
            raise TracingSetupError(f"exporter_import_path {path!r} must take no arguments")
    except (TypeError, ValueError):
        pass  # a builtin without a signature: called as it is
    try:
        made = function()
    except Exception as exc:
        raise TracingSetupError(
            f"exporter_import_path {path!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    processors = []
    for item in made if isinstance(made, list | tuple) else [made]:
        if isinstance(item, SpanProcessor):
            processors.append(item)
        elif isinstance(item, SpanExporter):
            processors.append(BatchSpanProcessor(item))
        else:
            raise TracingSetupError(
                f"exporter_import_path {path!r} returned {type(item).__name__}: it must return "
                "span processors (or span exporters), one or a list"
            )
    return processors


def _default_exporter(component: str) -> Any:
    """Ray's default: the spans as JSON, one per line, in ``spans/<component>_tracing.json``
    next to the process's log file; stderr when the process logs there."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    from kubeserve.runtime.logs import LOG_FILE_ENV

    log_file = os.environ.get(LOG_FILE_ENV)
    if not log_file:
        return ConsoleSpanExporter(out=sys.stderr, formatter=_one_line)
    spans_dir = os.path.join(os.path.dirname(log_file), "spans")
    os.makedirs(spans_dir, exist_ok=True)
    name = _FILE_SAFE.sub("_", component) + "_tracing.json"
    out = open(os.path.join(spans_dir, name), "a", buffering=1)  # noqa: SIM115 - the exporter's
    return ConsoleSpanExporter(out=out, formatter=_one_line)


def _one_line(span: Any) -> str:
    return json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n"
