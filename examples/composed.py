"""Two deployments composed: an HTTP ingress calls a Greeter through a DeploymentHandle.

The Greeter's greeting comes from ``user_config``: change it in the config and PUT again, and the
running replicas answer with the new greeting without restarting (their PIDs stay the same).

    curl -X POST localhost:8000/ -d '{"name": "Ada"}'   ->  {"message": "Hello, Ada!", ...}
"""

import os
from typing import Any

from kubeserve import DeploymentHandle, Request, deployment


@deployment(user_config={"greeting": "Hello"})
class Greeter:
    def __init__(self) -> None:
        self.greeting = "Hello"

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.greeting = config.get("greeting", "Hello")

    def greet(self, name: str) -> dict[str, Any]:
        return {"message": f"{self.greeting}, {name}!", "greeter_pid": os.getpid()}


@deployment
class Frontend:
    def __init__(self, greeter: DeploymentHandle) -> None:
        self.greeter = greeter

    async def __call__(self, request: Request) -> dict[str, Any]:
        name = "world"
        if request.method == "POST":
            name = (await request.json()).get("name", name)
        else:
            name = request.query_params.get("name", name)
        answer: dict[str, Any] = await self.greeter.greet.remote(name)
        return {**answer, "frontend_pid": os.getpid()}


app = Frontend.bind(Greeter.bind())
