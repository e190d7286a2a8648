"""Ray's quickstart shape: the graph built and deployed at the script's top level, then HTTP."""

import json
import os
import urllib.request

from ray import serve
from ray.serve.handle import DeploymentHandle


@serve.deployment
class Adder:
    def __init__(self, increment: int):
        self.increment = increment

    def add(self, x: int) -> int:
        return x + self.increment


@serve.deployment
class Ingress:
    def __init__(self, adder: DeploymentHandle):
        self.adder = adder

    async def __call__(self, request):
        x = int(request.query_params["x"])
        return {"sum": await self.adder.add.remote(x)}


app = Ingress.bind(Adder.bind(increment=2))
serve.run(app, name="quickstart", route_prefix="/quickstart")

with urllib.request.urlopen(os.environ["PROXY_URL"] + "/quickstart?x=3", timeout=30) as resp:
    print(json.dumps(json.loads(resp.read())))
