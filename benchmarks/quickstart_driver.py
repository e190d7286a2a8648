"""Ray Serve's quickstart as its documentation writes it: the graph defined and deployed with
``serve.run`` at the script's top level, then one HTTP request; prints that answer (one JSON
line). The bench runs it unchanged on both systems (``make bench``'s driver row): with Ray 2.60's
own ``python``, and with ``python -m kubeserve.compat``. 0.25 CPU per replica, as the bench's
other apps, so it fits on the bench's 2-CPU Ray head beside them."""

import json
import os
import urllib.request

from ray import serve
from ray.serve.handle import DeploymentHandle


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class Adder:
    def __init__(self, increment: int):
        self.increment = increment

    def add(self, x: int) -> int:
        return x + self.increment


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class Ingress:
    def __init__(self, adder: DeploymentHandle):
        self.adder = adder

    async def __call__(self, request):
        return {"sum": await self.adder.add.remote(int(request.query_params["x"]))}


serve.run(Ingress.bind(Adder.bind(increment=2)), name="quickstart", route_prefix="/quickstart")
with urllib.request.urlopen(os.environ["PROXY_URL"] + "/quickstart?x=3", timeout=60) as resp:
    print(json.dumps(json.loads(resp.read())), flush=True)
