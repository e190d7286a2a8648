"""The native data path (experimental, opt-in): the ``kubeserve-fastpath`` process in front of
the Python proxy.

``native/`` (Rust, ``make native``) builds one binary. Its ``serve`` command owns the
client-facing HTTP/1.1 keep-alive fast path: it parses each request, matches the route prefix,
picks a replica below its ``max_ongoing_requests`` (round-robin), forwards the request over a
pooled connection of the authenticated channel (the INGRESS role of
:mod:`~kubeserve.runtime.channel`, sealed frames of :mod:`~kubeserve.runtime.sealing`, byte for
byte) and relays the answer verbatim (``Content-Length``, chunked or until close), adding
``x-request-id`` as the Python proxy does (the client's usable id, else a generated one).

It accepts nothing before the first snapshot is pushed (as the Python proxy accepts nothing
before its routes are known): clients wait in the socket's backlog meanwhile.

A proxy serving TLS starts it with ``--tls``: it terminates TLS itself (rustls,
``native/src/tls.rs``) with the certificate pair the proxy loaded and checked
(:class:`~kubeserve.runtime.tls.NativeTLS`, the key decrypted, pushed in memory over the control
socket with :meth:`FastPath.push_tls`, again at each rotation: new handshakes take the new pair,
established connections go on), requires client certificates as the proxy does given
``ssl_ca_certs``, and hands off the decrypted bytes. It accepts no connection before the first
pair is in. A proxy tracing (spans are not made here yet) does not use it.

What it covers: HTTP/1.1 requests with no body or a ``Content-Length`` body up to
``max_body_bytes``, no hop-by-hop header but ``Connection: keep-alive`` (not forwarded, as the
Python proxy drops it), no ``Transfer-Encoding``, ``Upgrade``, ``Expect``..., no
``serve_multiplexed_model_id``, a deployment without a custom request router (Ray's
``request_router_class`` chooses in the Python proxy), a path in its normal form that matches a
route and is not one of the proxy's ``/-/`` endpoints, a deployment with a replica below its cap.
Everything else is **handed off**: from that request on, the client connection is spliced to the
Python proxy (on a private loopback port), with the bytes already read, so the answer is the Python
proxy's (404, 413, WebSockets, queueing for a busy replica, ``Retry-After``...). A replica that
answers "unserved" (shutting down, at capacity) hands the request off too, before any byte of that
answer reaches the client.

Ray's request metrics and access lines of the requests it answers are taken by the Python proxy
once a second (:meth:`FastPath.take_records`) and recorded as its own. Not yet at parity on the
fast path (the reason it is opt-in): the Python router does not see its requests in flight (a
replica at its cap answers "unserved" and the request waits in the Python proxy),
``--max-connections`` does not bound its connections, a leaving proxy's drain does not reach it,
the Python proxy sees handed-off clients as ``127.0.0.1``, and the replica choice is round-robin
below the cap rather than the Python router's.

:class:`FastPath` runs the process and speaks its control socket: one JSON object per line each
way, ``{"op": "state", "snapshot": ..., ...}`` (a discovery
:class:`~kubeserve.runtime.wire.Snapshot` and settings) and ``{"op": "stats"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kubeserve.runtime.channel import SECRET_ENV
from kubeserve.runtime.tls import NativeTLS
from kubeserve.runtime.wire import Snapshot

__all__ = [
    "BINARY_ENV",
    "DATA_PATH_ENV",
    "FastPath",
    "FastPathError",
    "FastPathRefused",
    "find_binary",
]

log = logging.getLogger(__name__)

#: The default of ``kubeserve proxy --data-path``, which ``kubeserve start --data-path`` sets for
#: the proxy it starts: ``native`` opts the proxy into this data path.
DATA_PATH_ENV = "KUBESERVE_DATA_PATH"

#: Names the ``kubeserve-fastpath`` binary to run (else ``native/target/release`` of a source
#: checkout, else ``$PATH``).
BINARY_ENV = "KUBESERVE_FASTPATH_BINARY"
_NAME = "kubeserve-fastpath"
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
#: How long the process may take to start listening.
START_TIMEOUT_S = 10.0


class FastPathError(RuntimeError):
    """The native process is missing, did not start, or refused what it was sent."""


class FastPathRefused(FastPathError):
    """The native process runs and refused what it was sent (it keeps what it had)."""


def find_binary() -> str | None:
    """The ``kubeserve-fastpath`` binary to run, or None when there is none."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return named
    built = Path(__file__).resolve().parents[3] / "native" / "target" / "release" / _NAME
    if built.is_file():
        return str(built)
    return shutil.which(_NAME)


class FastPath:
    """A running ``kubeserve-fastpath serve`` listening on ``host:port`` (0: a free port), handing
    what it does not cover to the Python proxy on ``127.0.0.1:fallback_port``."""

    def __init__(
        self,
        secret: bytes,
        host: str,
        port: int,
        fallback_port: int,
        binary: str | None = None,
        *,
        listen_fd: int | None = None,
        tls: bool = False,
    ) -> None:
        """``listen_fd``: serve on this inherited listening socket instead of binding
        ``host:port``; ``tls``: serve HTTPS, from the first pair :meth:`push_tls` gives."""
        self.secret = secret
        self.tls = tls
        self.listen_fd = listen_fd
        self.host = host
        self.port = port
        self.fallback_port = fallback_port
        self.binary = binary or find_binary()
        self.process: asyncio.subprocess.Process | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        if self.binary is None:
            raise FastPathError(
                f"no {_NAME} binary: build it with `make native`, or name it in ${BINARY_ENV}"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="kubeserve-fastpath-")
        os.chmod(self._dir.name, 0o700)
        control = os.path.join(self._dir.name, "control.sock")
        env = dict(os.environ)
        env[SECRET_ENV] = self.secret.decode()
        listen = f"{self.host}:{self.port}" if self.listen_fd is None else f"fd:{self.listen_fd}"
        self.process = await asyncio.create_subprocess_exec(
            self.binary,
            "serve",
            "--listen",
            listen,
            "--control",
            control,
            "--fallback",
            f"127.0.0.1:{self.fallback_port}",
            *(("--tls",) if self.tls else ()),
            env=env,
            stdin=asyncio.subprocess.PIPE,  # it exits when this end closes (we ended)
            stderr=asyncio.subprocess.PIPE,
            pass_fds=() if self.listen_fd is None else (self.listen_fd,),
        )
        assert self.process.stderr is not None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                line = (await self.process.stderr.readline()).decode(errors="replace")
        except TimeoutError:
            line = ""
        found = _LISTENING.search(line)
        if found is None:
            await self.close()
            raise FastPathError(f"{_NAME} did not start: {line.strip() or 'no output'}")
        self.port = int(found.group(2))
        self._control = await asyncio.open_unix_connection(control)

    async def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._control is None:
            raise FastPathError(f"{_NAME} is not running")
        reader, writer = self._control
        async with self._lock:
            writer.write(json.dumps(message).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
        if not line:
            raise FastPathError(f"{_NAME} closed its control socket")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise FastPathRefused(f"{_NAME} refused {message.get('op')}: {answer.get('error')}")
        return answer

    async def push(
        self,
        snapshot: Snapshot,
        *,
        keep_alive_timeout_s: float | None = None,
        request_timeout_s: float | None = None,
        header_timeout_s: float | None = None,
        body_timeout_s: float | None = None,
        max_body_bytes: int | None = None,
        max_head_bytes: int | None = None,
        max_url_bytes: int | None = None,
        latency_buckets_ms: list[float] | None = None,
        access_log: bool | None = None,
    ) -> None:
        """Install a discovery snapshot (and settings) in the native process;
        ``request_timeout_s`` None: no timeout."""
        settings = {
            "keep_alive_timeout_s": keep_alive_timeout_s,
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_body_bytes": max_body_bytes,
            "max_head_bytes": max_head_bytes,
            "max_url_bytes": max_url_bytes,
            "latency_buckets_ms": latency_buckets_ms,
            "access_log": access_log,
        }  # (one not given keeps the native process's default)
        message: dict[str, Any] = {
            "op": "state",
            "snapshot": snapshot,
            "request_timeout_s": request_timeout_s,
            **{name: value for name, value in settings.items() if value is not None},
        }
        await self._call(message)

    async def push_tls(self, files: NativeTLS) -> None:
        """Serve new handshakes with this certificate pair (the first: start accepting);
        :class:`FastPathRefused` when it does not load there (the previous pair keeps serving)."""
        message = {"op": "tls", "cert_pem": files.cert_pem, "key_pem": files.key_pem}
        await self._call({**message, "ca_pem": files.ca_pem})

    async def stats(self) -> dict[str, Any]:
        """``answered`` (deployment key -> status -> requests answered natively),
        ``latency_ms_sum`` (deployment key -> ms), ``handed_off`` (connections spliced to the
        Python proxy), ``upstream_connects`` (channel connections opened), ``tls_installs``
        (certificate pairs installed)."""
        return await self._call({"op": "stats"})

    async def take_records(self) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        """What the native path answered since the last call: the metrics records per label set
        (``method``, ``key`` (deployment key), ``status``, ``count``, ``total_ms`` and
        ``buckets``: counts per bucket of the ``latency_buckets_ms`` pushed, then +Inf), and,
        when ``access_log`` was pushed true, one access entry per request: ``[unix time, method,
        deployment key, status, latency ms, request id]``."""
        answer = await self._call({"op": "take_records"})
        if answer["access_dropped"]:
            log.warning("the native data path dropped %d access lines", answer["access_dropped"])
        return answer["records"], answer["access"]

    async def close(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        if self._control is not None:
            self._control[1].close()
            self._control = None
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
