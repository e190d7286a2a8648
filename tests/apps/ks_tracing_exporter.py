"""Test exporter for ``tracing_config.exporter_import_path``: every finished span as one JSON
line, in a file per process under ``$KS_TRACE_SPANS_DIR`` (spans are made in the proxy and in
each replica, so the test reads them all from there)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS_DIR_ENV = "KS_TRACE_SPANS_DIR"


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                context = span.get_span_context()
                assert context is not None
                parent = span.parent
                line = {
                    "name": span.name,
                    "trace_id": format(context.trace_id, "032x"),
                    "span_id": format(context.span_id, "016x"),
                    "parent_id": None if parent is None else format(parent.span_id, "016x"),
                    "attributes": dict(span.attributes or {}),
                    "start": span.start_time,
                    "end": span.end_time,
                    "status": span.status.status_code.name,
                    "component": span.resource.attributes.get("kubeserve.component"),
                    "pid": os.getpid(),
                }
                out.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


def exporter() -> list[SpanProcessor]:
    """Ray's contract: no arguments, a list of span processors."""
    spans_dir = os.environ[SPANS_DIR_ENV]
    os.makedirs(spans_dir, exist_ok=True)
    path = os.path.join(spans_dir, f"{os.getpid()}.jsonl")
    return [SimpleSpanProcessor(JsonLinesExporter(path))]


def not_a_processor() -> str:
    return "spans go nowhere"
