# The driver's API: two applications by name and route, handles to them from the driver
# (serve.get_app_handle, serve.get_deployment_handle, .remote().result()), serve.status(),
# errors raised by a deployment caught around .result(), a cancelled call, and serve.delete.
import time

import requests
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.exceptions import RequestCancelledError
from ray.serve.handle import DeploymentHandle


@serve.deployment
class Checker:
    def check(self, value: int) -> int:
        if value < 0:
            raise ValueError(f"negative value: {value}")
        return value

    def slow(self) -> str:
        time.sleep(2)
        return "done"


@serve.deployment
class Front:
    def __init__(self, checker: DeploymentHandle):
        self._checker = checker

    async def __call__(self, value: int) -> int:
        return await self._checker.check.remote(value) * 10


@serve.deployment
def greeter() -> str:
    return "hi there"


serve.run(Front.bind(Checker.bind()), name="checked", route_prefix="/checked")
serve.run(greeter.bind(), name="greeter", route_prefix="/greeter", blocking=False)

handle: DeploymentHandle = serve.get_app_handle("checked")
assert handle.remote(4).result() == 40
checker = serve.get_deployment_handle("Checker", app_name="checked")
assert checker.check.remote(7).result() == 7
assert requests.get("http://localhost:8000/greeter").text == "hi there"

try:
    handle.remote(-1).result()
except ValueError as e:
    assert "negative value: -1" in str(e)
    print("caught ValueError")
else:
    raise AssertionError("expected a ValueError")

try:
    checker.check.remote(-2).result()
except RayTaskError as e:
    assert isinstance(e, ValueError)
    assert isinstance(e.cause, ValueError)
    assert "Checker.check()" in str(e), "the text names where it was raised"
    print("caught RayTaskError:", type(e).__name__)

response = checker.slow.remote()
response.cancel()
try:
    response.result()
except RequestCancelledError as e:
    print("caught RequestCancelledError:", e)
else:
    raise AssertionError("expected a RequestCancelledError")

statuses = serve.status().applications
assert statuses["checked"].status == "RUNNING"
assert statuses["greeter"].status == "RUNNING"
serve.delete("greeter")
assert "greeter" not in serve.status().applications
