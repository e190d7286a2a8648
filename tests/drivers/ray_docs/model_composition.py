# Model composition: an ingress calling two deployments, responses passed between handle calls
# without awaiting them, and streaming through a handle.
from collections.abc import AsyncGenerator, Generator

import requests
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import Request


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
class Ingress:
    def __init__(self, adder: DeploymentHandle, multiplier: DeploymentHandle):
        self._adder = adder
        self._multiplier = multiplier

    async def __call__(self, input: int) -> int:
        adder_response: DeploymentResponse = self._adder.remote(input)
        # The response is passed on without awaiting it: Serve resolves it first.
        multiplier_response: DeploymentResponse = self._multiplier.remote(adder_response)
        return await multiplier_response


app = Ingress.bind(Adder.bind(increment=1), Multiplier.bind(multiple=2))
handle: DeploymentHandle = serve.run(app)
response = handle.remote(5)
assert response.result() == 12, "(5 + 1) * 2 = 12"


@serve.deployment
class Streamer:
    def __call__(self, limit: int) -> Generator[int, None, None]:
        yield from range(limit)


@serve.deployment
class Caller:
    def __init__(self, streamer: DeploymentHandle):
        self._streamer = streamer.options(stream=True)

    async def __call__(self, request: Request) -> list:
        limit = int(request.query_params.get("limit", "5"))
        gen: AsyncGenerator = self._streamer.remote(limit)
        return [i async for i in gen]


serve.run(Caller.bind(Streamer.bind()))
assert requests.get("http://localhost:8000/?limit=4").json() == [0, 1, 2, 3]
