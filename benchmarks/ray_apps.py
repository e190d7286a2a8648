"""Ray Serve 2.60 twins of the benchmark's applications, imported by Ray's replicas.

``noop`` mirrors ``benchmarks/apps.py``; ``composed`` mirrors ``examples/composed.py`` (an HTTP
ingress calling a Greeter through a DeploymentHandle, the greeting coming from ``user_config``).
Only the Ray virtualenv imports this module.
"""

import os
from typing import Any

from ray import serve  # type: ignore[import-not-found]
from starlette.requests import Request  # type: ignore[import-not-found]
from starlette.responses import PlainTextResponse  # type: ignore[import-not-found]


@serve.deployment(max_ongoing_requests=100, ray_actor_options={"num_cpus": 0.25})
class Noop:
    def __call__(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")


@serve.deployment(user_config={"greeting": "Hello"}, ray_actor_options={"num_cpus": 0.25})
class Greeter:
    def __init__(self) -> None:
        self.greeting = "Hello"

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.greeting = config.get("greeting", "Hello")

    def greet(self, name: str) -> dict[str, Any]:
        return {"message": f"{self.greeting}, {name}!", "greeter_pid": os.getpid()}


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class Frontend:
    def __init__(self, greeter: Any) -> None:
        self.greeter = greeter

    async def __call__(self, request: Request) -> dict[str, Any]:
        name = "world"
        if request.method == "POST":
            name = (await request.json()).get("name", name)
        else:
            name = request.query_params.get("name", name)
        answer: dict[str, Any] = await self.greeter.greet.remote(name)
        return {**answer, "frontend_pid": os.getpid()}


noop = Noop.bind()
composed = Frontend.bind(Greeter.bind())
