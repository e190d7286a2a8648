"""Test application for ``tracing_config``: an ingress that calls a downstream deployment through
a handle; both answer with the span their code runs in (as ``opentelemetry.trace`` shows it to
user code) and whether OpenTelemetry is loaded in their process at all."""

# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from kubeserve import DeploymentHandle, Request, StreamingResponse, deployment


def seen_by_user_code() -> dict[str, Any]:
    """The current span's ids, without importing OpenTelemetry where nothing loaded it."""
    loaded = "opentelemetry.trace" in sys.modules
    if not loaded:
        return {"otel_loaded": False}
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return {
        "otel_loaded": True,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
    }


@deployment
class Downstream:
    def echo(self, x: int) -> dict[str, Any]:  # sync: runs in a worker thread
        return {"x": x, **seen_by_user_code()}

    def count(self, n: int, pause: float = 0.0) -> Iterator[dict[str, Any]]:  # a streamed call
        for i in range(n):
            if i:
                time.sleep(pause)
            yield {"i": i, **seen_by_user_code()}


@deployment
class Ingress:
    def __init__(self, downstream: DeploymentHandle) -> None:
        self.downstream = downstream

    async def __call__(self, request: Request) -> Any:
        if request.url.path.endswith("/stream"):
            return StreamingResponse(self.stream(float(request.query_params["pause"])))
        seen = seen_by_user_code()
        await asyncio.sleep(float(request.query_params.get("sleep", 0)))
        answer = await self.downstream.echo.remote(1)
        streamed = [item async for item in self.downstream.options(stream=True).count.remote(2)]
        return {"ingress": seen, "downstream": answer, "streamed": streamed}

    async def stream(self, pause: float) -> AsyncIterator[str]:
        """A streamed answer: a line per item of a streamed handle call, each ``pause`` s
        after the one before, with the span the ingress's code runs in at that moment."""
        items = self.downstream.options(stream=True).count.remote(3, pause)
        async for item in items:
            yield json.dumps({"ingress": seen_by_user_code(), "downstream": item}) + "\n"


app = Ingress.bind(Downstream.bind())
