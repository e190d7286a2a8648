"""A deployment's exception as the driver catches it: ``RayTaskError(ValueError)`` whose text is
the replica's traceback with the user's frames (file, line, function, and the source line where
the file exists), for each way user code runs in a replica: a sync method (a worker thread), an
async method, a sync generator streamed, and a call through another deployment. The classes
live in ``__main__``: they travel pickled by value."""

import json

from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle


def refuse(value):
    raise ValueError(f"negative value: {value}")  # marker: refuse


@serve.deployment
class Checker:
    def check(self, value):
        refuse(value)  # marker: check

    async def check_async(self, value):
        refuse(value)  # marker: check_async

    def count(self, n):
        yield 0
        refuse(n)  # marker: count


@serve.deployment
class Front:
    def __init__(self, checker: DeploymentHandle):
        self.checker = checker

    async def __call__(self, value):
        return await self.checker.check.remote(value)  # marker: front


handle = serve.run(Front.bind(Checker.bind()), name="tracebacks", route_prefix="/tracebacks")
checker = serve.get_deployment_handle("Checker", app_name="tracebacks")
calls = {
    "check": lambda: checker.check.remote(-1).result(),
    "check_async": lambda: checker.check_async.remote(-2).result(),
    "count": lambda: list(checker.options(stream=True).count.remote(-3)),
    "front": lambda: handle.remote(-4).result(),
}
out = {}
for name, call in calls.items():
    try:
        call()
    except RayTaskError as exc:
        out[name] = {"type": type(exc).__name__, "value_error": isinstance(exc, ValueError)}
        out[name]["text"] = str(exc)
serve.delete("tracebacks")
print(json.dumps(out))
