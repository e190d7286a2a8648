"""An application's custom autoscaling policies, asked in a process of the application's own
environment (:mod:`kubeserve.runtime.autoscaling_policy`), never in the controller.

Why a process of its own: a policy is user code. In the controller it could block the loop every
application depends on, leak memory there, or crash it; and it needs the application's
``working_dir``, ``py_modules`` and variables, which the controller does not have. So one small
process per application with a custom policy, started on the first decision in the environment
the build ran in, keeps the policies' state and class instances between calls. Each call has a
deadline: a policy that hangs is killed (and started again at the next decision); one that raises
or answers garbage gets its error back. Either way the caller leaves the replica count as it was.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeserve.backends.local import processes
from kubeserve.control.autoscaling_state import PolicyFailure

log = logging.getLogger(__name__)

#: How long one decision may take, the policy process's start (imports) included for the first.
CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PolicyLaunch:
    """How to start the process: arguments after the module, environment, directory, stdin's
    first line (an imperative application's pickled graph) and where its stderr goes."""

    args: list[str]
    env: dict[str, str]
    cwd: str | None
    log_path: Path
    preamble: bytes = b""


class PolicyProcess:
    """Asks one application's policies; one call at a time; owns the process it starts."""

    def __init__(self, launch: Callable[[], Awaitable[PolicyLaunch]]) -> None:
        self._launch = launch
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The policy host's answer (see :func:`~kubeserve.control.autoscaling_state.ask_policy`);
        :class:`PolicyFailure` when the process failed or did not answer in time."""
        async with self._lock:
            fresh = self._proc is None or self._proc.returncode is not None
            timeout = START_TIMEOUT_S if fresh else CALL_TIMEOUT_S
            try:
                answer = await asyncio.wait_for(self._exchange(request), timeout)
            except TimeoutError:
                self.stop()
                raise PolicyFailure(
                    f"the policy did not answer within {timeout:.0f} s; its process was stopped"
                ) from None
            except (OSError, ValueError) as exc:
                self.stop()
                raise PolicyFailure(f"the policy process failed: {exc}") from None
        return answer

    async def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = await self._running()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            code = await proc.wait()
            launch = await self._launch()
            raise ValueError(f"it exited with code {code} (see {launch.log_path})")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError(f"it answered {line[:200]!r}")
        return answer

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        launch = await self._launch()
        self._proc = await processes.spawn_piped(
            "kubeserve.runtime.autoscaling_policy",
            launch.args,
            env=launch.env,
            log_path=launch.log_path,
            cwd=launch.cwd,
        )
        if launch.preamble:
            assert self._proc.stdin is not None
            self._proc.stdin.write(launch.preamble + b"\n")
        return self._proc

    def stop(self) -> None:
        """Kill the process (and what it started); the next call starts a new one."""
        if self._proc is not None and self._proc.returncode is None:
            processes.kill_group(self._proc.pid)
        self._proc = None
