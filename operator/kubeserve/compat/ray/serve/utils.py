"""``ray.serve.utils``: the OpenTelemetry context of the request a replica serves."""

from __future__ import annotations

from typing import Any

from kubeserve.runtime import tracing

__all__ = ["get_trace_context"]


def get_trace_context() -> Any | None:
    """The current OpenTelemetry context (inside a deployment: its replica span's) when this
    process traces (``tracing_config.enabled``), else None, as in Ray. Pass it as ``context=`` to
    a tracer's ``start_as_current_span`` for a child span of the request's trace (the span is
    current already, so omitting it does the same)."""
    if tracing.ACTIVE is None:
        return None
    from opentelemetry import context

    return context.get_current() or None
