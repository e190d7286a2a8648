"""The controller process's own health, as GET /api/serve/applications/ reports it (Ray's
``controller_health_metrics``): measured in the process that answers, on either backend."""

from __future__ import annotations

import asyncio
import os
import time

from kubeserve.control.details import ControllerHealth

__all__ = ["controller_health"]

#: when this process loaded the backend: its controller's start, unless the caller knows better
_LOADED_AT = time.time()


def controller_health(started_at: float | None = None) -> ControllerHealth:
    """Now, the start time, the asyncio tasks of the running loop and the resident memory."""
    return ControllerHealth(
        timestamp=time.time(),
        started_at=_LOADED_AT if started_at is None else started_at,
        asyncio_tasks=len(asyncio.all_tasks()),
        memory_mb=_resident_mb(),
    )


def _resident_mb() -> float:
    """The resident set size now (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
