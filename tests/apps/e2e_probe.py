"""Test application for end-to-end tests: reports its PID, env (``KS_*`` and ``KUBESERVE_*``) and
config; health is file-driven.

``check_health`` fails while the file named by ``KS_HEALTH_FILE`` exists, which lets a test make a
replica unhealthy from outside and heal the deployment again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from kubeserve import Request, deployment


@deployment(health_check_period_s=0.2, health_check_timeout_s=1)
class Probe:
    def __init__(self) -> None:
        self.config: Any = None
        self.reconfigured = 0  # how often reconfigure ran in this process

    def reconfigure(self, config: Any) -> None:
        self.config = config
        self.reconfigured += 1

    def check_health(self) -> None:
        flag = os.environ.get("KS_HEALTH_FILE")
        if flag and Path(flag).exists():
            raise RuntimeError(f"unhealthy because {flag} exists")

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.url.path.endswith("/slow"):
            await asyncio.sleep(float(request.query_params.get("s", "1")))
        return {
            "pid": os.getpid(),
            "config": self.config,
            "reconfigured": self.reconfigured,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("KS_", "KUBESERVE_"))},
        }


app = Probe.bind()
