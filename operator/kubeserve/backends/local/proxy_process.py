"""The local HTTP proxy process: started with the serving layer, restarted when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Literal

from kubeserve.backends.local import processes
from kubeserve.backends.local.deployment_state import ReplicaContext
from kubeserve.control import backoff

ProxyStatusValue = Literal["STARTING", "HEALTHY", "UNHEALTHY", "DRAINING"]


class ProxyProcess:
    """Owns at most one proxy process; :meth:`reconcile` keeps it running on ``host:port``."""

    def __init__(self, context: ReplicaContext) -> None:
        self._ctx = context
        self.host = ""
        self.port = 0
        self.status: ProxyStatusValue = "STARTING"
        self.pid: int | None = None
        self.last_error = ""
        self.log_path: Path = context.log_dir / "proxy.log"
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._next_start = 0.0
        self._failures = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def reconcile(self, host: str, port: int, options: dict[str, object]) -> None:
        if self.running or time.monotonic() < self._next_start:
            return
        self.host, self.port, self._stopping = host, port, False
        self.status = "STARTING"
        self._task = asyncio.ensure_future(self._run(options))

    async def _run(self, options: dict[str, object]) -> None:
        args = ["--host", self.host, "--port", str(self.port)]
        args += ["--controller-url", self._ctx.controller_url]
        if options.get("request_timeout_s") is not None:
            args += ["--request-timeout-s", str(options["request_timeout_s"])]
        if options.get("keep_alive_timeout_s") is not None:
            args += ["--keep-alive-timeout-s", str(options["keep_alive_timeout_s"])]
        if options.get("logging_config"):  # the serve config's top-level logging_config
            args += ["--logging-config", json.dumps(options["logging_config"])]
        args += self._ctx.request_limits.cli_args()
        extra = {**self._ctx.data_plane_env(), **self._ctx.log_env(self.log_path)}
        env = self._ctx.child_env(extra, [])
        self._proc = await processes.spawn(
            "kubeserve.runtime.proxy", args, env=env, log_path=self.log_path
        )
        self.pid = self._proc.pid
        exited = asyncio.ensure_future(self._proc.wait())
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        url = f"http://{probe_host}:{self.port}/-/healthz"
        healthy_at = 0.0
        if await processes.wait_until_answering(
            processes.http_probe(self._ctx.session, url),
            exited,
            lambda: self.status == "STARTING",
            0.05,
        ):
            self.status, healthy_at = "HEALTHY", time.monotonic()
        code = await exited
        processes.kill_group(self._proc.pid)
        if not self._stopping:
            stable = healthy_at and time.monotonic() - healthy_at >= backoff.STABLE_AFTER_S
            self._failures = 1 if stable else self._failures + 1
            delay = backoff.restart_delay(self._failures)
            self.status = "UNHEALTHY"
            self.last_error = (
                f"proxy exited with code {code}, restarting in {delay:g} s: "
                f"{processes.log_tail(self.log_path, 5)}"
            )
            self._next_start = time.monotonic() + delay
            asyncio.get_running_loop().call_later(delay, self._ctx.wake)
        self._ctx.wake()

    async def stop(self) -> None:
        self._stopping = True
        self.status = "DRAINING"
        if self._proc is not None:
            await processes.terminate(self._proc, 5.0)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task, self._proc, self.pid = None, None, None
