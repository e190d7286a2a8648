"""Stopping the background tasks of the runtime's long-lived objects (discovery's poll, the load
report, the certificate watch, the proxy's native-path exchanges, the local controller's loop)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait until it has ended; its cancellation is
    not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
