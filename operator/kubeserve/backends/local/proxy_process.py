"""The local HTTP proxy process: started with the serving layer, restarted when it dies.

Invariants: the listening socket belongs to ``kubeserve start``, not to a proxy process. It is
opened once per address and inherited by every proxy started on it (``--listen-fd``), so a proxy
that dies leaves its connections-to-be waiting in the socket's backlog for its successor, never
refused. A proxy an earlier ``kubeserve start`` left serving is adopted when it was started with
the wanted arguments, and the socket is copied back from it (``pidfd_getfd``) when the kernel
allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Literal

from kubeserve.backends.local import processes
from kubeserve.backends.local.adoption import AdoptedProxy
from kubeserve.backends.local.process_records import ProxyRecord
from kubeserve.backends.local.replica_context import ReplicaContext
from kubeserve.control import backoff, effective_config
from kubeserve.control.instance import grpc_proxy_arguments
from kubeserve.runtime.fastpath import ALLOCATOR_ENV
from kubeserve.runtime.tls import PASSWORD_ENV, TLSFiles

ProxyStatusValue = Literal["STARTING", "HEALTHY", "UNHEALTHY", "DRAINING"]


class ProxyProcess:
    """Owns at most one proxy process; :meth:`reconcile` keeps it running on ``host:port``."""

    def __init__(self, context: ReplicaContext, adopted: AdoptedProxy | None = None) -> None:
        self._ctx = context
        self.host = ""
        self.port = 0
        self.status: ProxyStatusValue = "STARTING"
        self.pid: int | None = None
        self.last_error = ""
        self.log_path: Path = context.log_dir / "proxy.log"
        self._task: asyncio.Task[None] | None = None
        self._proc: processes.Child | None = None
        self._stopping = False
        self._next_start = 0.0
        self._failures = 0
        #: the listening socket every proxy inherits, and its address
        self._listener: socket.socket | None = None
        self._listening_on: tuple[str, int] | None = None
        #: a proxy of an earlier run, until the first reconcile keeps or replaces it
        self._adopted = adopted
        #: the TLS files the proxy serves (``http_options.ssl_*``), ``None`` for plain HTTP
        self._tls: TLSFiles | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def reconcile(self, host: str, port: int, options: dict[str, object]) -> None:
        if self.running or time.monotonic() < self._next_start:
            return
        self.host, self.port, self._stopping = host, port, False
        self.status = "STARTING"
        adopted, self._adopted = self._adopted, None
        self._task = asyncio.ensure_future(self._run(self._args(options), adopted))

    def _args(self, options: dict[str, object]) -> list[str]:
        args = ["--host", self.host, "--port", str(self.port)]
        args += ["--controller-url", self._ctx.controller_url]
        if options.get("request_timeout_s") is not None:
            args += ["--request-timeout-s", str(options["request_timeout_s"])]
        if options.get("keep_alive_timeout_s") is not None:
            args += ["--keep-alive-timeout-s", str(options["keep_alive_timeout_s"])]
        if options.get("logging_config"):  # the serve config's top-level logging_config
            args += ["--logging-config", json.dumps(options["logging_config"])]
        if options.get("tracing_config"):  # when it enables tracing
            args += ["--tracing-config", json.dumps(options["tracing_config"])]
        self._tls = TLSFiles.from_http_options(options)
        if self._tls is not None:  # relative paths mean from kubeserve start's directory
            args += ["--ssl-certfile", os.path.abspath(self._tls.certfile)]
            args += ["--ssl-keyfile", os.path.abspath(self._tls.keyfile)]
            if self._tls.ca_certs:
                args += ["--ssl-ca-certs", os.path.abspath(self._tls.ca_certs)]
        args += grpc_proxy_arguments(options.get("grpc_options"))  # type: ignore[arg-type]
        # kubeserve start's data path, chosen once there (native terminates TLS too): always
        # given, so the proxy neither chooses again nor says again why it fell back to python
        args += ["--data-path", self._ctx.data_path.value]
        return args + self._ctx.request_limits.cli_args()

    async def _run(self, args: list[str], adopted: AdoptedProxy | None) -> None:
        fingerprint = effective_config.fingerprint(args)
        proc = await self._keep_or_stop(adopted, fingerprint)
        if proc is None:
            proc = await self._spawn(args, fingerprint)
            if proc is None:
                return
        self._proc, self.pid = proc, proc.pid
        exited = asyncio.ensure_future(proc.wait())
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if self._tls is None:
            url = f"http://{probe_host}:{self.port}/-/healthz"
            probe = processes.http_probe(self._ctx.session, url)
        else:
            probe = processes.tls_probe(probe_host, self.port, bool(self._tls.ca_certs))
        healthy_at = 0.0
        if await processes.wait_until_answering(
            probe,
            exited,
            lambda: self.status == "STARTING",
            0.05,
        ):
            self.status, healthy_at = "HEALTHY", time.monotonic()
        code = await exited
        processes.kill_group(proc.pid)
        self._ctx.records.remove_proxy()
        if not self._stopping:
            self._failed(f"proxy exited with code {code}", healthy_at)
        self._ctx.wake()

    async def _keep_or_stop(
        self, adopted: AdoptedProxy | None, fingerprint: str
    ) -> processes.Child | None:
        """The proxy of an earlier run when it serves what is wanted now; else it is stopped."""
        if adopted is None:
            return None
        if adopted.record.fingerprint == fingerprint:
            if adopted.listener is not None:
                self._listener, self._listening_on = adopted.listener, (self.host, self.port)
            return adopted.proc
        if adopted.listener is not None:
            adopted.listener.close()
        await processes.terminate(adopted.proc, 5.0)
        self._ctx.records.remove_proxy()
        return None

    async def _spawn(self, args: list[str], fingerprint: str) -> processes.Child | None:
        try:
            listener = self._listen()
        except OSError as exc:
            self._failed(f"cannot listen on {self.host}:{self.port}: {exc}", 0.0)
            return None
        extra = {
            **ALLOCATOR_ENV,
            **self._ctx.data_plane_env(),
            **self._ctx.log_env(self.log_path),
        }
        if self._tls is not None and self._tls.password:
            extra[PASSWORD_ENV] = self._tls.password
        env = self._ctx.child_env(extra, [])
        fd = listener.fileno()
        proc = await processes.spawn(
            "kubeserve.runtime.proxy",
            [*args, "--listen-fd", str(fd)],
            env=env,
            log_path=self.log_path,
            pass_fds=(fd,),
            die_with_parent=self._ctx.die_with_parent,
        )
        started = processes.start_time(proc.pid)
        if started is not None:
            self._ctx.records.put_proxy(ProxyRecord(fingerprint, fd, proc.pid, started))
        return proc

    def _listen(self) -> socket.socket:
        """The socket listening on the wanted address (opened when the address is new)."""
        if self._listener is None or self._listening_on != (self.host, self.port):
            self._close_listener()
            self._listener = processes.listening_socket(self.host, self.port)
            self._listening_on = (self.host, self.port)
        return self._listener

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._listener, self._listening_on = None, None

    def _failed(self, what: str, healthy_at: float) -> None:
        """Restart after a backoff; a proxy that had served stably is restarted at once (its
        clients wait in the listening socket's backlog meanwhile)."""
        stable = healthy_at and time.monotonic() - healthy_at >= backoff.STABLE_AFTER_S
        self._failures = 1 if stable else self._failures + 1
        delay = backoff.restart_delay(self._failures - 1)
        self.status = "UNHEALTHY"
        self.last_error = (
            f"{what}, restarting in {delay:g} s: {processes.log_tail(self.log_path, 5)}"
        )
        self._next_start = time.monotonic() + delay
        asyncio.get_running_loop().call_later(delay, self._ctx.wake)

    async def stop(self) -> None:
        """Stop the proxy (and one of an earlier run not reconciled yet), and stop listening."""
        self._stopping = True
        self.status = "DRAINING"
        adopted, self._adopted = self._adopted, None
        if adopted is not None:
            if adopted.listener is not None:
                adopted.listener.close()
            await processes.terminate(adopted.proc, 5.0)
        if self._proc is not None:
            await processes.terminate(self._proc, 5.0)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._ctx.records.remove_proxy()
        self._close_listener()
        self._task, self._proc, self.pid = None, None, None
