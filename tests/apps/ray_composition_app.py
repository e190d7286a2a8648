"""Model composition as Ray's documentation writes it: handles, responses, streaming."""

from typing import Generator

from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import Request
from starlette.responses import StreamingResponse


@serve.deployment
class Adder:
    def __init__(self, increment: int):
        self._increment = increment

    def __call__(self, val: int) -> int:
        return val + self._increment


@serve.deployment
class Multiplier:
    def __init__(self, multiple: int):
        self._multiple = multiple

    def __call__(self, val: int) -> int:
        return val * self._multiple


@serve.deployment
class Streamer:
    def __call__(self, limit: int) -> Generator[int, None, None]:
        for i in range(limit):
            yield i


@serve.deployment
class Ingress:
    def __init__(
        self, adder: DeploymentHandle, multiplier: DeploymentHandle, streamer: DeploymentHandle
    ):
        self._adder = adder
        self._multiplier = multiplier
        self._streamer = streamer.options(stream=True)
        self._unstreamed = streamer

    async def __call__(self, request: Request):
        if request.url.path.endswith("/stream"):
            gen = self._streamer.remote(int(request.query_params.get("n", "5")))

            async def lines():
                async for i in gen:
                    yield f"{i}\n"

            return StreamingResponse(lines(), media_type="text/plain")
        if request.url.path.endswith("/not-streamed"):
            try:
                await self._unstreamed.remote(3)
            except TypeError as e:
                return {"error": str(e)}
            return {"error": None}
        value = int(request.query_params["input"])
        adder_response: DeploymentResponse = self._adder.remote(value)
        # Pass the adder response directly into the multiplier (no `await` needed).
        multiplier_response: DeploymentResponse = self._multiplier.remote(adder_response)
        return {"result": await multiplier_response}


app = Ingress.bind(Adder.bind(increment=1), Multiplier.bind(multiple=2), Streamer.bind())


@serve.deployment
class SyncIngress:
    def __init__(self, adder: DeploymentHandle, streamer: DeploymentHandle):
        self._adder = adder
        self._streamer = streamer

    def __call__(self, request: Request) -> dict:
        value = int(request.query_params["input"])
        total = self._adder.remote(value).result()
        streamed = list(self._streamer.options(stream=True).remote(3))
        return {"result": total, "streamed": streamed}


sync_app = SyncIngress.bind(Adder.bind(increment=10), Streamer.bind())


math_app = Multiplier.bind(multiple=3)
