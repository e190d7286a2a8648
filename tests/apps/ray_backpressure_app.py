"""Backpressure set in code, as Ray 2.60's documentation writes it."""

from __future__ import annotations

import asyncio

from ray import serve
from ray.serve.config import BackpressureConfig


@serve.deployment(
    max_ongoing_requests=1,
    max_queued_requests=1,
    backpressure_config=BackpressureConfig(status_code=429, retry_after_s=2.5),
)
class Limited:
    async def __call__(self, request) -> str:
        await asyncio.sleep(float(request.query_params.get("s", "0")))
        return "done"


app = Limited.bind()
