"""Test application for the fault test: records every execution by request id.

Each request appends ``<x-request-id> <pid>`` to ``executions-<pid>`` in the directory named by
``KS_FAULT_DIR`` *before* doing its work (a short sleep, so that kills find requests in flight):
a request executed twice shows up twice, even when the replica running it dies.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from kubeserve import Request, deployment


@deployment(num_replicas=3, max_ongoing_requests=16, health_check_period_s=0.5)
class Recorder:
    def __init__(self) -> None:
        directory = Path(os.environ["KS_FAULT_DIR"])
        self.fd = os.open(
            directory / f"executions-{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )

    def reconfigure(self, user_config: object) -> None:
        """Accepts any ``user_config`` (the disk-full test sends a large one)."""
        self.user_config = user_config

    async def __call__(self, request: Request) -> str:
        request_id = request.headers.get("x-request-id", "-")
        os.write(self.fd, f"{request_id} {os.getpid()}\n".encode())  # one append: atomic
        await asyncio.sleep(random.uniform(0.005, 0.05))
        return request_id


app = Recorder.bind()
#: the same application under another import path (a change of it rolls every replica)
same_app = Recorder.bind()
