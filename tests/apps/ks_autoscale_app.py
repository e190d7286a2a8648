"""Test application for autoscaling: a slow deployment, and a frontend calling it by handle."""

# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import asyncio
import os
from typing import Any

from kubeserve import DeploymentHandle, Request, deployment


@deployment
class Slow:
    def __init__(self) -> None:
        self.running = 0
        self.highest = 0

    async def __call__(self, request: Request) -> dict[str, Any]:
        await asyncio.sleep(float(request.query_params.get("s", "0.5")))
        return {"pid": os.getpid()}

    async def work(self, seconds: float) -> dict[str, Any]:
        self.running += 1
        self.highest = max(self.highest, self.running)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.running -= 1
        return {"pid": os.getpid()}

    def peak(self) -> int:
        """The most calls this replica ever ran at once."""
        return self.highest


@deployment
class Front:
    def __init__(self, backend: DeploymentHandle) -> None:
        self.backend = backend

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.query_params.get("peak"):
            return {"peak": await self.backend.peak.remote()}
        seconds = float(request.query_params.get("s", "0"))
        answer = await self.backend.work.remote(seconds)
        return {"front_pid": os.getpid(), "backend_pid": answer["pid"]}


slow = Slow.bind()
front = Front.bind(Slow.bind())
