"""Test application for autoscaling: a slow deployment, and a frontend calling it by handle."""

# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import asyncio
import os
from typing import Any

from kubeserve import DeploymentHandle, Request, deployment


@deployment
class Slow:
    async def __call__(self, request: Request) -> dict[str, Any]:
        await asyncio.sleep(float(request.query_params.get("s", "0.5")))
        return {"pid": os.getpid()}

    async def work(self, seconds: float) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"pid": os.getpid()}


@deployment
class Front:
    def __init__(self, backend: DeploymentHandle) -> None:
        self.backend = backend

    async def __call__(self, request: Request) -> dict[str, Any]:
        seconds = float(request.query_params.get("s", "0"))
        answer = await self.backend.work.remote(seconds)
        return {"front_pid": os.getpid(), "backend_pid": answer["pid"]}


slow = Slow.bind()
front = Front.bind(Slow.bind())
