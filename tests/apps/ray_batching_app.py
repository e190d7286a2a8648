"""Dynamic request batching as Ray's documentation writes it."""

from typing import List

from ray import serve
from starlette.requests import Request


@serve.deployment
class BatchedModel:
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.2)
    async def handle_batch(self, inputs: List[int]) -> List[dict]:
        return [{"output": x * 2, "batch_size": len(inputs)} for x in inputs]

    async def __call__(self, request: Request):
        return await self.handle_batch(int(request.query_params["x"]))


app = BatchedModel.bind()
