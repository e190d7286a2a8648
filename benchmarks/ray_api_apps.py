"""Applications written against Ray Serve's Python API, run unchanged by kubeserve and by Ray.

Both import them as ``ray_api_apps:...`` with this directory on ``PYTHONPATH`` (inside kubeserve's
processes ``ray.serve`` resolves to kubeserve's implementation; Ray's workers run in the Ray 2.60
virtualenv). Each is what Ray's documentation shows for the feature:

* ``fastapi_app``: a FastAPI ingress (``@serve.ingress``) over ``app``, which uvicorn also serves
  alone (``uvicorn ray_api_apps:app``, the anchor row);
* ``streaming_app``: an ingress returning a ``StreamingResponse`` over a streaming handle call
  (``handle.options(stream=True)``) to a generator deployment;
* ``batched_app`` / ``unbatched_app``: a "model" that takes 20 ms per call whatever the batch size
  and runs one call at a time (as an accelerator would), behind ``@serve.batch`` or called once per
  request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve  # type: ignore[import-not-found]
from starlette.requests import Request
from starlette.responses import StreamingResponse

MODEL_CALL_S = 0.02
SMALL = {"num_cpus": 0.25}

app = FastAPI()


@app.get("/hello")
async def hello(name: str = "world") -> dict[str, str]:
    return {"message": f"Hello, {name}!"}


@serve.deployment(max_ongoing_requests=100, ray_actor_options=SMALL)
@serve.ingress(app)
class FastAPIIngress:
    pass


@serve.deployment(max_ongoing_requests=100, ray_actor_options=SMALL)
class Chunks:
    async def __call__(self, count: int) -> AsyncIterator[str]:
        for i in range(count):
            yield f"{i}\n"


@serve.deployment(max_ongoing_requests=100, ray_actor_options=SMALL)
class StreamIngress:
    def __init__(self, chunks: Any) -> None:
        self.chunks = chunks.options(stream=True)

    async def __call__(self, request: Request) -> StreamingResponse:
        count = int(request.query_params.get("n", "100"))
        return StreamingResponse(self.chunks.remote(count), media_type="text/plain")


class _Model:
    """One call at a time, ``MODEL_CALL_S`` per call for one input or a whole batch."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def predict(self, inputs: list[str]) -> list[str]:
        async with self.lock:
            await asyncio.sleep(MODEL_CALL_S)
        return [f"ok {x}" for x in inputs]


@serve.deployment(max_ongoing_requests=200, ray_actor_options=SMALL)
class Batched(_Model):
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def handle_batch(self, inputs: list[str]) -> list[str]:
        return await self.predict(inputs)

    async def __call__(self, request: Request) -> str:
        result: str = await self.handle_batch(request.query_params.get("x", ""))
        return result


@serve.deployment(max_ongoing_requests=200, ray_actor_options=SMALL)
class Unbatched(_Model):
    async def __call__(self, request: Request) -> str:
        return (await self.predict([request.query_params.get("x", "")]))[0]


fastapi_app = FastAPIIngress.bind()
streaming_app = StreamIngress.bind(Chunks.bind())
batched_app = Batched.bind()
unbatched_app = Unbatched.bind()


# --- autoscaling and overload (benchmarks/autoscaling.py) --------------------------------------

#: The same autoscaling_config on both systems: 1 to 2 replicas, short delays.
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 1,
    "downscale_delay_s": 5,
    "metrics_interval_s": 1,
    "look_back_period_s": 2,
}
WORK_S = 0.05


@serve.deployment(max_ongoing_requests=5, autoscaling_config=AUTOSCALING, ray_actor_options=SMALL)
class Scaled:
    """Answers which replica served the request, after ``WORK_S`` of (async) work."""

    async def __call__(self, request: Request) -> str:
        await asyncio.sleep(WORK_S)
        return str(serve.get_replica_context().replica_id.unique_id)


@serve.deployment(
    max_ongoing_requests=5,
    autoscaling_config={**AUTOSCALING, "min_replicas": 0, "initial_replicas": 0},
    ray_actor_options=SMALL,
)
class FromZero:
    async def __call__(self, request: Request) -> str:
        return "ok"


@serve.deployment(
    num_replicas=1, max_ongoing_requests=2, max_queued_requests=4, ray_actor_options=SMALL
)
class Capped:
    """Serves two requests at a time, queues four more; the rest get a 503 at once."""

    async def __call__(self, request: Request) -> str:
        await asyncio.sleep(WORK_S)
        return "ok"


scaled_app = Scaled.bind()
from_zero_app = FromZero.bind()
capped_app = Capped.bind()
