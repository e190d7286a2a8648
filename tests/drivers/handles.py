"""Handles from the driver: a FastAPI ingress, streaming, awaiting, composition with responses
passed between deployments, then serve.delete."""

import asyncio
import json
import os
import urllib.request

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

api = FastAPI()


@serve.deployment
class Doubler:
    def double(self, x: int) -> int:
        return 2 * x

    def count_to(self, n: int):
        yield from range(n)


@serve.deployment
@serve.ingress(api)
class Front:
    def __init__(self, doubler: DeploymentHandle):
        self.doubler = doubler

    @api.get("/double/{x}")
    async def double(self, x: int) -> dict:
        return {"double": await self.doubler.double.remote(x)}

    async def twice(self, x: int) -> int:
        once = self.doubler.double.remote(x)
        return await self.doubler.double.remote(once)


handle = serve.run(Front.bind(Doubler.bind()), name="handles", route_prefix="/handles")
out = {"twice": handle.twice.remote(3).result()}
doubler = serve.get_deployment_handle("Doubler", app_name="handles")
out["streamed"] = list(doubler.options(stream=True).count_to.remote(3))


async def main() -> int:
    return await handle.twice.remote(5)


out["awaited"] = asyncio.run(main())
with urllib.request.urlopen(os.environ["PROXY_URL"] + "/handles/double/21", timeout=30) as resp:
    out["http"] = json.loads(resp.read())
serve.delete("handles")
out["after_delete"] = "handles" in serve.status().applications
print(json.dumps(out))
