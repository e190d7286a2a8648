"""The native data path (the default): the ``kubeserve-fastpath`` process in front of the
Python proxy.

It is the default of ``kubeserve start``, ``kubeserve proxy`` and the proxy pods of a
ServeInstance; ``--data-path python`` opts out. A defaulted native path with no binary (a ``pip
install`` without the Rust build) serves on the Python path instead, said once
(:func:`choose_data_path`); an explicit ``--data-path native`` with no binary is an error.

``native/`` (Rust, ``make native``) builds one binary. Its ``serve`` command owns the
client-facing HTTP/1.1 keep-alive fast path: it parses each request, matches the route prefix,
picks a replica as the Python router does (power of two choices on requests in flight, below
``max_ongoing_requests``; the counts are both processes', see below), forwards the request over a
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
Python proxy (on its private unix socket), with the bytes already read, so the answer is the Python
proxy's (404, 413, WebSockets, queueing for a busy replica, ``Retry-After``...). A replica that
answers "unserved" (shutting down, at capacity) hands the request off too, before any byte of that
answer reaches the client.

Parity with the Python proxy, which owns the policy (the native process only applies it):

* **Load.** Every 50 ms the Python proxy sends its requests in flight per replica and gets the
  native ones back (:meth:`FastPath.exchange_load`); each side chooses by the sum, and the Python
  router counts the native requests as its own
  (:meth:`~kubeserve.runtime.router.Router.set_external`) and in Ray's ongoing-requests gauge of
  the proxy. When every replica is at its cap the
  request is handed off and waits in the Python proxy's queue, which its load reports count for
  the autoscaler (replicas report what they run, native requests included).
* **Connections.** ``max_connections`` (pushed with the state) bounds the client connections,
  spliced ones included, and one over it gets the Python proxy's 503 (``take_records`` counts
  them for its log).
* **Drain.** :meth:`FastPath.drain` (a leaving proxy, ``LeavePlan``): no more accepting,
  ``Connection: close`` on every answer, connections idle for a second closed, requests in
  flight finished.

Behind it the Python proxy runs on asyncio's own event loop, not uvloop: it supervises, follows
discovery, takes the records and serves what is handed off, and uvloop (~2 MB of its resident
memory) pays for itself where the Python proxy serves every request (``--data-path python``);
requests handed off cost it more CPU here (``benchmarks/README.md``).

The private listener the connections are spliced to is a unix socket in a directory only the
proxy's user may enter (``--fallback unix:PATH``): no other local process reaches the Python proxy
behind the native process's back, so none skips what the client port checks (a client certificate
with ``ssl_ca_certs``). Handed-off clients reach it with no address, which no part of the Python
proxy uses (the ASGI ``client`` comes from ``X-Forwarded-For``, access lines carry no address).

With ``grpc_port``, it also owns the gRPC port (``native/src/grpc.rs``): it serves the common
unary and server-streaming calls of Ray Serve's gRPC ingress itself and proxies every other call,
HTTP/2 stream by stream, to the Python grpc.aio server on a private unix socket in the same 0700
directory as the HTTP one (:mod:`~kubeserve.runtime.proxy.grpc_ingress`, ``native``). Its
state (snapshot and call templates, :meth:`FastPath.push_grpc`) and records
(:meth:`FastPath.take_grpc_records`) go over a control socket of its own.

:class:`FastPath` runs the process and speaks its control socket: one JSON object per line each
way, ``{"op": "state", "snapshot": ..., ...}`` (a discovery
:class:`~kubeserve.runtime.wire.Snapshot` and settings), ``stats``, ``take_records``, ``load``
and ``drain``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from kubeserve.runtime.channel import SECRET_ENV
from kubeserve.runtime.private_dir import PrivateDir
from kubeserve.runtime.tls import NativeTLS
from kubeserve.runtime.wire import Snapshot

__all__ = [
    "ALLOCATOR_ENV",
    "BINARY_ENV",
    "DATA_PATH_ENV",
    "MISSING_BINARY",
    "FastPath",
    "FastPathError",
    "FastPathRefused",
    "Records",
    "choose_data_path",
    "find_binary",
]

log = logging.getLogger(__name__)

#: Chooses the data path of ``kubeserve start`` and ``kubeserve proxy`` when their ``--data-path``
#: is not given (``kubeserve start`` passes its choice to the proxy it starts as the flag): an
#: explicit choice, as the flag is.
DATA_PATH_ENV = "KUBESERVE_DATA_PATH"

#: The environment a proxy process starts with (``kubeserve start``'s proxy and the proxy pods
#: alike): glibc's malloc gives blocks of 64 KiB and more pages of their own and returns free
#: heap past 128 KiB, instead of raising both thresholds to the largest block freed (its
#: default), after which a burst's buffers (a take's access lines, a large request) stay in the
#: heap: after a minute of load, 1.6 MB less of the Python proxy (``benchmarks/README.md``).
#: The native child sets its own mmap threshold (``native/src/memory.rs``).
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}

#: Names the ``kubeserve-fastpath`` binary to run (else ``native/target/release`` of a source
#: checkout, else ``$PATH``).
BINARY_ENV = "KUBESERVE_FASTPATH_BINARY"
_NAME = "kubeserve-fastpath"
#: Longest answer line read from the control socket: a ``take_records`` answer holds a metrics
#: record per label set (its access lines come after the line, ``access_bytes`` of them), past
#: asyncio's 64 KiB default with many routes.
_CONTROL_LINE_LIMIT = 64 * 1024 * 1024
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
#: How long the process may take to start listening.
START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Records:
    """What the native path did since the last :meth:`FastPath.take_records`."""

    #: metrics records per label set: ``method``, ``key`` (deployment key), ``status``,
    #: ``count``, ``total_ms`` and ``buckets`` (counts per bucket of the ``latency_buckets_ms``
    #: pushed, then +Inf)
    metrics: list[dict[str, Any]]
    #: when ``access_log`` was pushed true, the access lines of the requests, formatted as the
    #: :class:`~kubeserve.runtime.logs.AccessLog` pushed (``native_format``) writes them
    access: str
    #: client connections refused over ``max_connections``
    refused: int


#: Why the native data path cannot run here, and how to get it.
MISSING_BINARY = (
    f"no {_NAME} binary: build it with `make native` in a kubeserve checkout (Rust's cargo), "
    f"or name it in ${BINARY_ENV} (the kubeserve image ships it)"
)


def choose_data_path(requested: str | None, default: str) -> str:
    """The data path to serve with, ``python`` or ``native``: ``requested`` (``--data-path``,
    else ``$KUBESERVE_DATA_PATH``) when given, else ``default``, except that a default of
    ``native`` with no binary (:func:`find_binary`) falls back to ``python``, logging one warning
    that says how to get the binary: a newcomer's ``pip install`` serves. An explicit ``native``
    with no binary is returned as is: the caller refuses it (:data:`MISSING_BINARY`)."""
    if requested is not None:
        return requested
    if default == "native" and find_binary() is None:
        log.warning(
            "serving on the Python data path, not the default native one: %s; "
            "--data-path python chooses the Python path without this message",
            MISSING_BINARY,
        )
        return "python"
    return default


class FastPathError(RuntimeError):
    """The native process is missing, did not start, or refused what it was sent."""


class FastPathRefused(FastPathError):
    """The native process runs and refused what it was sent (it keeps what it had)."""


def find_binary() -> str | None:
    """The ``kubeserve-fastpath`` binary to run, or None when there is none."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return named
    checkout = os.path.realpath(__file__)
    for _ in range(4):  # runtime, kubeserve, operator, the checkout (os.path: no pathlib here)
        checkout = os.path.dirname(checkout)
    built = os.path.join(checkout, "native", "target", "release", _NAME)
    if os.path.isfile(built):
        return built
    import shutil  # here only: a proxy started with its binary named carries no shutil

    return shutil.which(_NAME)


class FastPath:
    """A running ``kubeserve-fastpath serve`` listening on ``host:port`` (0: a free port), handing
    what it does not cover to the Python proxy at ``fallback``: a port on ``127.0.0.1``, or
    ``unix:PATH``, the private socket a proxy uses (:meth:`ProxyServer._start_native`)."""

    def __init__(
        self,
        secret: bytes,
        host: str,
        port: int,
        fallback: int | str,
        binary: str | None = None,
        *,
        listen_fd: int | None = None,
        tls: bool = False,
        grpc: tuple[str, int, str] | None = None,
    ) -> None:
        """``listen_fd``: serve on this inherited listening socket instead of binding
        ``host:port``; ``tls``: serve HTTPS, from the first pair :meth:`push_tls` gives."""
        self.secret = secret
        #: the gRPC front's host, port (0: a free one) and the Python gRPC server's private
        #: listener (``unix:PATH``, or ``HOST:PORT``)
        self.grpc = grpc
        self.grpc_port: int | None = None
        self._grpc_control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._grpc_lock = asyncio.Lock()
        self.tls = tls
        self.listen_fd = listen_fd
        self.host = host
        self.port = port
        self.fallback = fallback if isinstance(fallback, str) else f"127.0.0.1:{fallback}"
        self.binary = binary or find_binary()
        self.process: asyncio.subprocess.Process | None = None
        self._dir: PrivateDir | None = None
        self._control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        if self.binary is None:
            raise FastPathError(MISSING_BINARY)
        if not os.access(self.binary, os.X_OK):
            raise FastPathError(f"{_NAME} {self.binary!r} (${BINARY_ENV}) is no executable file")
        self._dir = PrivateDir("kubeserve-fastpath-")
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
            self.fallback,
            *(("--tls",) if self.tls else ()),
            *self._grpc_args(),
            env=env,
            stdin=asyncio.subprocess.PIPE,  # it exits when this end closes (we ended)
            stderr=asyncio.subprocess.PIPE,
            pass_fds=() if self.listen_fd is None else (self.listen_fd,),
        )
        assert self.process.stderr is not None
        found = grpc_found = None
        line = ""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while found is None or (self.grpc is not None and grpc_found is None):
                    line = (await self.process.stderr.readline()).decode(errors="replace")
                    match = _LISTENING.search(line)
                    if match is None:
                        break
                    if " grpc listening" in line:
                        grpc_found = match
                    else:
                        found = match
        except TimeoutError:
            pass
        if found is None or (self.grpc is not None and grpc_found is None):
            await self.close()
            raise FastPathError(f"{_NAME} did not start: {line.strip() or 'no output'}")
        self.port = int(found.group(2))
        self._control = await asyncio.open_unix_connection(control, limit=_CONTROL_LINE_LIMIT)
        if grpc_found is not None:
            self.grpc_port = int(grpc_found.group(2))
            self._grpc_control = await asyncio.open_unix_connection(
                self._grpc_socket(), limit=_CONTROL_LINE_LIMIT
            )

    def _grpc_socket(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir.name, "grpc.sock")

    def _grpc_args(self) -> tuple[str, ...]:
        if self.grpc is None:
            return ()
        host, port, fallback = self.grpc
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return (
            "--grpc-listen",
            listen,
            "--grpc-control",
            self._grpc_socket(),
            "--grpc-fallback",
            fallback,
        )

    async def _call(self, message: dict[str, Any], *, grpc: bool = False) -> dict[str, Any]:
        control, lock = (
            (self._grpc_control, self._grpc_lock) if grpc else (self._control, self._lock)
        )
        if control is None:
            raise FastPathError(f"{_NAME} is not running")
        reader, writer = control
        access = ""
        async with lock:
            try:
                writer.write(json.dumps(message).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
                answer: dict[str, Any] = json.loads(line) if line else {}
                # a take's access lines follow its line: text, no JSON to unescape
                size = answer.get("access_bytes") or 0
                if size:
                    access = (await reader.readexactly(size)).decode(errors="replace")
            except asyncio.IncompleteReadError:
                line = b""  # it ended within an answer: as closing before one
            except BaseException:
                # cancelled (or failed) between a question and its answer: a later call would
                # read this answer as its own, so the control connection is not used again
                if grpc:
                    if self._grpc_control is not None and self._grpc_control[1] is writer:
                        self._grpc_control = None
                        writer.close()
                elif self._control is not None and self._control[1] is writer:
                    self._control = None
                    writer.close()
                raise
        if not line:
            raise FastPathError(f"{_NAME} closed its control socket")
        if "access_bytes" in answer:
            answer["access"] = access
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
        access_format: dict[str, Any] | None = None,
        max_connections: int | None = None,
    ) -> None:
        """Install a discovery snapshot (and settings) in the native process;
        ``request_timeout_s`` None: no timeout; ``access_format`` (with ``access_log`` true):
        :meth:`~kubeserve.runtime.logs.AccessLog.native_format` of the log the lines go to."""
        settings = {
            "keep_alive_timeout_s": keep_alive_timeout_s,
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_body_bytes": max_body_bytes,
            "max_head_bytes": max_head_bytes,
            "max_url_bytes": max_url_bytes,
            "latency_buckets_ms": latency_buckets_ms,
            "access_log": access_log,
            "access_format": access_format,
            "max_connections": max_connections,
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

    async def push_grpc(
        self,
        snapshot: Snapshot,
        methods: dict[str, dict[str, Any]],
        *,
        request_timeout_s: float | None,
        latency_buckets_ms: list[float],
        access_log: bool,
        access_format: dict[str, Any] | None = None,
    ) -> None:
        """Install a snapshot and the unary and server-streaming methods it serves
        (``GrpcIngress.native_methods``) in the gRPC front; ``request_timeout_s``:
        ``grpc_options.request_timeout_s``; ``access_format``: as :meth:`push`'s."""
        message = {
            "op": "state",
            "snapshot": snapshot,
            "methods": methods,
            "request_timeout_s": request_timeout_s,
            "latency_buckets_ms": latency_buckets_ms,
            "access_log": access_log,
            "access_format": access_format,
        }
        await self._call(message, grpc=True)

    async def take_grpc_records(self) -> tuple[list[dict[str, Any]], str]:
        """The gRPC front's calls since the last take: records per label set (``method`` (the
        full method), ``app``, ``key`` (deployment key), ``code`` (the status code's name),
        ``count``, ``total_ms``, ``buckets``) and their access lines (``GET``-style lines of
        ``full method, application, code``, formatted as :attr:`Records.access`)."""
        answer = await self._call({"op": "take_records"}, grpc=True)
        if answer["access_dropped"]:
            log.warning("the native gRPC front dropped %d access lines", answer["access_dropped"])
        return answer["records"], answer["access"]

    async def stats(self) -> dict[str, Any]:
        """``answered`` (deployment key -> status -> requests answered natively),
        ``latency_ms_sum`` (deployment key -> ms), ``handed_off`` (connections spliced to the
        Python proxy), ``upstream_connects`` (channel connections opened), ``tls_installs``
        (certificate pairs installed)."""
        return await self._call({"op": "stats"})

    async def take_records(self) -> Records:
        """What the native path answered (and refused) since the last call."""
        answer = await self._call({"op": "take_records"})
        if answer["access_dropped"]:
            log.warning("the native data path dropped %d access lines", answer["access_dropped"])
        return Records(answer["records"], answer["access"], answer["refused"])

    async def exchange_load(self, theirs: dict[str, int]) -> dict[str, int]:
        """Give the native process the Python proxy's requests in flight per replica id (a
        replica not named: none), replacing the last ones; get back its own (replicas with none
        left out). Both then choose a replica by the sum, against one ``max_ongoing_requests``."""
        answer = await self._call({"op": "load", "in_flight": theirs})
        ours: dict[str, int] = answer["in_flight"]
        return ours

    async def drain(self, timeout_s: float) -> bool:
        """Drain the native process, for at most ``timeout_s``: it accepts no more connections
        (the listening socket is closed), answers every request with ``Connection: close``,
        closes connections idle for a second, and lets the requests in flight (and the
        connections spliced to the Python proxy) finish. Whether none is left open; the process
        still answers on its control socket (the last records), :meth:`close` ends it."""
        await self._call({"op": "drain"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (await self.stats())["open_connections"] > 0:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def close(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        for control in (self._control, self._grpc_control):
            if control is not None:
                control[1].close()
        self._control = self._grpc_control = None
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
