"""Garbage collection of the ``pip`` / ``uv`` environments of ``kubeserve start``.

An environment (:mod:`kubeserve.runtime.python_env`) is in use while an application's current
config maps to it (its build, its policy process, a deployment's target) or while a running
replica has it on its ``PYTHONPATH`` (read from ``/proc``, so a replica adopted from an earlier
run, or of a version being replaced, keeps its environment). When to collect: after a controller
pass in which an environment stopped being wanted, and after the first pass once every replica
of an earlier run has been adopted or stopped; an unused environment used less than ``keep_s``
ago is looked at again ``keep_s`` later. A redeploy of a spec whose environment was collected
costs a uv install from uv's cache (hard links, no download).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from kubeserve.runtime import python_env

log = logging.getLogger(__name__)


class PythonEnvCollector:
    """Owned by the controller; :meth:`after_pass` is called at the end of every pass."""

    def __init__(self, root: Path, wake: Callable[[], None], keep_s: float) -> None:
        self._root, self._wake, self._keep_s = root, wake, keep_s
        self._wanted: set[str] | None = None
        self._due = False
        self._task: asyncio.Task[None] | None = None

    def after_pass(self, wanted: set[str], replica_pids: Iterable[int], *, ready: bool) -> None:
        """``ready``: every replica of an earlier run has been adopted or stopped."""
        if not ready:
            return
        if self._wanted is None or self._wanted - wanted:
            self._due = True
        self._wanted = set(wanted)
        if self._due and (self._task is None or self._task.done()):
            self._due = False
            self._task = asyncio.ensure_future(self._collect(set(wanted), list(replica_pids)))

    async def _collect(self, wanted: set[str], pids: list[int]) -> None:
        in_use = wanted | await asyncio.to_thread(python_env.envs_in_environ, pids, self._root)
        removed, young = await asyncio.to_thread(
            python_env.collect_garbage, self._root, in_use, min_age_s=self._keep_s
        )
        if removed:
            log.info("removed unused runtime_env package environments: %s", ", ".join(removed))
        if young:
            asyncio.get_running_loop().call_later(self._keep_s + 0.5, self._again)

    def _again(self) -> None:
        self._due = True
        self._wake()
