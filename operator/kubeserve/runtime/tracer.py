"""The OpenTelemetry side of :mod:`kubeserve.runtime.tracing`, imported only by processes that
trace (and by ``kubeserve start``'s check of a config, :func:`unavailable`, which imports nothing
of OpenTelemetry itself)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import inspect
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from kubeserve.runtime.tracing import TRACE_HEADERS, TracingSetupError

__all__ = ["Tracer", "import_exporter", "unavailable"]

_INSTRUMENTATION = "kubeserve"
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.#-]+")
_TRACE_HEADERS = tuple(name.encode() for name in TRACE_HEADERS)


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
                "tracing needs OpenTelemetry in this process: "
                "pip install 'kubeserve[tracing]' (opentelemetry-api, opentelemetry-sdk)",
                field="enabled",
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

    def proxy_request(
        self,
        headers: list[tuple[bytes, bytes]],
        request_id: bytes | None,
        method: bytes,
        labels: tuple[str, str, str],
        websocket: bool = False,
    ) -> tuple[Any, list[tuple[bytes, bytes]] | None, bytes]:
        """A proxied request's span (``labels``: its route, application and deployment),
        child of the client's trace-context ``headers`` when it sent them: the span, the headers
        without the client's trace context (None when it sent none) and the header lines that
        carry the span to the replica instead (the replica's span is the proxy's child).
        A ``websocket`` handshake's span is Ray's ``proxy_websocket_request``, method ``WS``."""
        carrier: dict[str, str] = {}
        kept = []
        for name, value in headers:
            if len(name) in (10, 11) and name.lower() in _TRACE_HEADERS:
                carrier[name.lower().decode("latin-1")] = value.decode("latin-1")
            else:
                kept.append((name, value))
        route, app, deployment = labels
        verb = "WS" if websocket else method.decode("latin-1")
        kind = "websocket" if websocket else "http"
        span, forward = self.proxy_span(
            carrier,
            f"proxy_{kind}_request {deployment} {verb} {route}",
            {
                "request_id": request_id.decode("latin-1") if request_id else "",
                "app": app,
                "deployment": deployment,
                "request_type": kind,
                "request_method": verb,
                "request_route_path": route,
                "http.method": verb,
                "http.route": route,
            },
        )
        lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in forward.items())
        return span, kept if carrier else None, lines

    def proxy_rpc(self, metadata: Any, full_method: str, app: str, deployment: str) -> Any:
        """A gRPC call's span in the proxy (Ray's ``proxy_grpc_request``), child of the client's
        ``traceparent``/``tracestate`` ``metadata`` when it sent them. End it with
        :meth:`end_rpc`."""
        carrier = {
            key: value
            for key, value in metadata or ()
            if key in TRACE_HEADERS and isinstance(value, str)
        }
        span, _ = self.proxy_span(
            carrier,
            f"proxy_grpc_request {deployment} {full_method}",
            {
                "app": app,
                "deployment": deployment,
                "request_type": "grpc",
                "rpc.system": "grpc",
                "rpc.method": full_method,
            },
        )
        return span

    def end_rpc(self, span: Any, code: Any, request_id: str) -> None:
        """End a gRPC call's span with its status code (a ``grpc.StatusCode``; not OK marks the
        span an error) and the request id the call had."""
        if span.is_recording():
            span.set_attribute("rpc.grpc.status_code", code.name)
            if request_id:
                span.set_attribute("request_id", request_id)
            if code.name != "OK":
                span.set_status(self._trace.StatusCode.ERROR, code.name)
        span.end()

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
    def inside(self, span: Any, end: bool = True) -> Iterator[Any]:
        """Run the block (the user's code) inside ``span``: ``get_current_span()`` is this span
        there. An exception escaping the block is recorded on it and ends it; else the span ends
        with the block when ``end`` (without: its owner ends it, as :meth:`streamed` does)."""
        with self._active(span):
            try:
                yield span
            except GeneratorExit:  # the caller stopped iterating a stream: not an error
                span.end()
                raise
            except BaseException as exc:
                self.end(span, error=exc)
                raise
        if end:
            span.end()

    async def streamed(self, span: Any, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``chunks`` produced inside ``span``, which ends with the stream (its last chunk, an
        error, or the consumer stopping): a streamed answer's replica span covers all of it."""
        with self.inside(span):
            async for chunk in chunks:
                yield chunk

    def replica_call(
        self,
        config: Mapping[str, Any],
        method: str,
        request_id: str,
        carrier: Mapping[str, str] | None,
        **more: Any,
    ) -> Any:
        """The span of a call of ``method`` on this replica (``config``: its
        :class:`~kubeserve.runtime.wire.ReplicaConfig`), child of the caller's context in
        ``carrier``, named and labelled as Ray's; run the user's code in it with :meth:`inside`."""
        attributes = {
            "request_id": request_id,
            "replica_id": config["replica_id"],
            "app": config["app"],
            "deployment": config["deployment"],
            "call_method": method,
            **more,
        }
        name = f"replica_handle_request {config['deployment']} {method}"
        parent = self._propagator.extract(carrier) if carrier else None
        return self._tracer.start_span(
            name, context=parent, kind=self._server, attributes=_present(attributes)
        )

    @staticmethod
    def headers_carrier(headers: list[tuple[str, str]]) -> dict[str, str]:
        """The W3C trace-context headers among a request's ``headers``."""
        return {
            name.lower(): value
            for name, value in headers
            if len(name) in (10, 11) and name.lower() in TRACE_HEADERS
        }

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
