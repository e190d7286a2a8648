"""Test application for replica tests: one class deployment exercising every return type."""

# mypy keeps the class type under a class decorator (python/mypy#3135), so it cannot see that
# @deployment turned the class into a Deployment with .bind() and .options().
# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from kubeserve import JSONResponse, PlainTextResponse, Request, Response, deployment


class Unpicklable(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lock = __import__("threading").Lock()


@deployment(num_replicas=2, max_ongoing_requests=7, user_config={"greeting": "hello"})
class Echo:
    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.greeting = "unset"
        self.healthy = True
        self.reconfigured = 0  # how often reconfigure ran

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.reconfigured += 1
        if config.get("fail"):
            raise ValueError("bad user_config")
        self.greeting = config["greeting"]

    def check_health(self) -> None:
        if not self.healthy:
            raise RuntimeError("marked unhealthy")

    async def __call__(self, request: Request) -> Any:
        kind = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if kind == "str":
            return f"{self.prefix}{self.greeting}"
        if kind == "bytes":
            return b"\x00\x01raw"
        if kind == "dict":
            return {
                "greeting": self.greeting,
                "pid": os.getpid(),
                "reconfigured": self.reconfigured,
            }
        if kind == "none":
            return None
        if kind == "response":
            return Response("created", status_code=201, headers={"X-Kind": "custom"})
        if kind == "json":
            return JSONResponse({"a": [1, 2]}, status_code=202)
        if kind == "text":
            return PlainTextResponse("plain")
        if kind == "stream":
            return self._numbers(int(request.query_params.get("n", "3")))
        if kind == "syncstream":
            return iter(["a", "b", "c"])
        if kind == "boom":
            raise ValueError("user code exploded")
        if kind == "sick":
            self.healthy = False
            return "now unhealthy"
        if kind == "slow":
            await asyncio.sleep(float(request.query_params.get("s", "1")))
            return "slow done"
        if kind == "timeout":  # asyncio.timeout and a TaskGroup need the task a request runs in
            async with asyncio.timeout(5):
                async with asyncio.TaskGroup() as group:
                    child = group.create_task(asyncio.sleep(0, "child"))
            return {"task": asyncio.current_task() is not None, "child": child.result()}
        if kind == "timedstream":
            return self._timed_numbers()
        if kind == "log":  # records of the user's own, at two levels
            logging.getLogger("ray.serve").debug("debug from user code")
            logging.getLogger("echo.user").info("info from user code")
            return "logged"
        if kind == "environ":
            return {"keys": sorted(os.environ)}
        if kind == "inspect":
            return {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "tags": request.query_params.getlist("tag"),
                "x_token": request.headers.get("x-token"),
                "x_multi": request.headers.getlist("X-Multi"),
                "body": (await request.body()).decode(),
                "json": await request.json() if request.method == "POST" else None,
            }
        return f"unknown {kind}"

    async def _numbers(self, n: int) -> AsyncIterator[str]:
        for i in range(n):
            await asyncio.sleep(0.01)
            yield f"{i}\n"

    async def _timed_numbers(self) -> AsyncIterator[str]:
        async with asyncio.timeout(5):
            for i in range(2):
                await asyncio.sleep(0)
                yield f"{i}\n"

    async def bounded(self) -> bool:
        """An async method that asks for its task before its first wait."""
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        return asyncio.current_task() is not None

    def add(self, a: int, b: int = 0) -> int:
        return a + b

    def later(self) -> Any:
        """A plain method returning a coroutine: awaited in a task (asyncio.timeout needs one)."""

        async def within_a_timeout() -> bool:
            async with asyncio.timeout(5):
                await asyncio.sleep(0)
            return asyncio.current_task() is not None

        return within_a_timeout()

    async def fail(self) -> None:
        raise KeyError("missing thing")

    def fail_unpicklable(self) -> None:
        raise Unpicklable("cannot ship this")

    def chunks(self) -> Iterator[str]:
        yield "x"


app = Echo.bind("> ")
unbound = Echo
not_an_app = 42


@deployment
def hello(request: Request) -> str:
    return f"hello from a function at {request.url.path}"


function_app = hello.bind()
