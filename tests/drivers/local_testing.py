"""Ray's local testing mode: ``serve.run(app, _local_testing_mode=True)`` runs the application in
the driver's process; handles call it there. No instance answers (KUBESERVE_ADDRESS points
nowhere): nothing of this may reach one."""

import json
import os
import time

from ray import serve
from ray.serve.handle import DeploymentHandle


@serve.deployment(user_config={"factor": 3})
class Multiplier:
    def __init__(self):
        self.factor = 1
        self.pid = os.getpid()

    def reconfigure(self, config):
        self.factor = config["factor"]

    def times(self, x):
        return x * self.factor

    def count(self, n):
        yield from range(n)

    def where(self):
        return self.pid

    def refuse(self, x):
        raise ValueError(f"refused {x}")

    def slow(self):
        time.sleep(5)


@serve.deployment
class Ingress:
    def __init__(self, multiplier: DeploymentHandle):
        self.multiplier = multiplier

    async def __call__(self, x):
        return await self.multiplier.times.remote(x) + 1

    async def keep(self, items):
        items.append("changed")  # a copy: the caller's list stays as it was
        return items


@serve.deployment
class Broken:
    def __init__(self):
        raise ValueError("constructor failed")


handle = serve.run(Ingress.bind(Multiplier.bind()), name="local", _local_testing_mode=True)
mine = [1]
out = {
    "answer": handle.remote(4).result(),
    "kept": handle.keep.remote(mine).result(),
    "mine": mine,
    "streamed": list(
        serve.get_deployment_handle("Multiplier", "local").options(stream=True).count.remote(3)
    ),
    "same_process": serve.get_deployment_handle("Multiplier", "local").where.remote().result()
    == os.getpid(),
}
multiplier = serve.get_deployment_handle("Multiplier", "local")


def cancelled():
    response = multiplier.slow.remote()
    response.cancel()
    return response.result()


calls = {  # each raises in the caller what Ray's local testing mode raises: type and message
    "raised": lambda: multiplier.refuse.remote(1).result(),
    "raised_through_ingress": lambda: handle.remote("x").result(),
    "no_such_method": lambda: multiplier.nope.remote().result(),
    "generator_not_streamed": lambda: multiplier.count.remote(2).result(),
    "streamed_not_generator": lambda: list(multiplier.options(stream=True).times.remote(2)),
    "timeout": lambda: multiplier.slow.remote().result(timeout_s=0.1),
    "cancelled": cancelled,
}
out["errors"] = {}
for case, call in calls.items():
    try:
        call()
    except Exception as exc:
        out["errors"][case] = [type(exc).__name__, str(exc)]
try:
    serve.run(Broken.bind(), name="broken", _local_testing_mode=True)
except ValueError as exc:
    out["broken"] = str(exc)
print(json.dumps(out))
