"""The native data path (``native/``, ``kubeserve-fastpath``): its channel client against the real
replica server, and its HTTP/1.1 fast path in front of the real Python proxy, with the hand-off of
what it does not cover.

Real processes: the Rust binary runs as a subprocess; the replica servers
(:class:`~kubeserve.runtime.replica.http.ReplicaHttpServer`, behind the channel handshake) and the
Python proxy run in the test's event loop. ``make test`` builds the binary first (``make native``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeserve.runtime import channel, local_socket, logs
from kubeserve.runtime.channel import ServerChannel
from kubeserve.runtime.fastpath import FastPath, find_binary
from kubeserve.runtime.metrics import exposition
from kubeserve.runtime.proxy import ProxyServer
from kubeserve.runtime.proxy.server import LeavePlan
from kubeserve.runtime.replica.http import (
    HttpRequest,
    HttpResponse,
    ReplicaHttpServer,
    StreamedResponse,
)
from kubeserve.runtime.wire import UNSERVED_HEADER, Snapshot
from support.channel_front import SECRET
from support.common import free_port, run, wait_until
from support.static_source import StaticSource

BINARY = find_binary()


@pytest.fixture(autouse=True)
def _built() -> None:
    if BINARY is None:
        pytest.fail("no kubeserve-fastpath binary: `make native` builds it (`make test` does)")


def _snapshot(
    prefix: str, deployment: str, replicas: list[dict[str, Any]], max_ongoing: int = 8
) -> Any:
    """A discovery snapshot of one route to one deployment of app ``app``."""
    deployments = {f"app#{deployment}": {"max_ongoing_requests": max_ongoing, "replicas": replicas}}
    return {
        "version": 1,
        "routes": [{"route_prefix": prefix, "app": "app", "deployment": deployment}],
        "deployments": deployments,
    }


def _endpoint(replica_id: str, port: int) -> dict[str, Any]:
    return {"replica_id": replica_id, "host": "127.0.0.1", "port": port}


class Echo:
    """A replica application: echoes, streams, or answers as a draining replica does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[HttpRequest] = []
        self.draining = False

    async def __call__(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        self.seen.append(request)
        if self.draining:
            return HttpResponse(503, b"draining", {UNSERVED_HEADER: "shutting-down"}, close=True)
        if request.path.endswith("/sleep"):
            await asyncio.sleep(1.0)
        if request.path.endswith("/stream"):
            return StreamedResponse(200, {"content-type": "text/plain"}, self._chunks())
        headers = {"x-replica": self.name, "x-path": request.path, "x-query": request.query_string}
        return HttpResponse(200, request.body or request.method.encode(), headers)

    async def _chunks(self) -> AsyncIterator[bytes]:
        for i in range(3):
            await asyncio.sleep(0.01)
            yield b"part%d;" % i


async def replica(app: Echo, identity: str) -> tuple[asyncio.Server, int]:
    server = await asyncio.get_running_loop().create_server(
        ReplicaHttpServer(app, control=app, secret=SECRET, identity=identity), "127.0.0.1", 0
    )
    return server, server.sockets[0].getsockname()[1]


async def probe(*args: str) -> tuple[int, bytes, bytes]:
    """``kubeserve-fastpath probe``: one request over a channel connection the Rust code made."""
    assert BINARY is not None
    proc = await asyncio.create_subprocess_exec(
        BINARY,
        "probe",
        *args,
        env={"KUBESERVE_DATA_PLANE_SECRET": SECRET.decode()},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out, err


# -- phase 1: the channel client -----------------------------------------------------------------


def test_the_rust_channel_client_is_answered_by_a_real_replica() -> None:
    async def go() -> None:
        app = Echo("a")
        server, port = await replica(app, "replica-a")
        try:
            rc, out, err = await probe("127.0.0.1", str(port), "replica-a", "GET", "/hi?x=1")
            assert rc == 0, err
            head, _, body = out.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), out
            assert b"x-path: /hi" in head and b"x-query: x=1" in head
            assert body == b"GET"
            # above 1 KiB both directions switch to HMAC-SHA256 tags
            big = "y" * 5000
            rc, out, err = await probe("127.0.0.1", str(port), "replica-a", "POST", "/b", big)
            assert rc == 0, err
            assert out.endswith(b"\r\n\r\n" + big.encode())
            assert [r.path for r in app.seen] == ["/hi", "/b"]
        finally:
            server.close()

    run(go())


def test_the_rust_channel_client_is_refused_for_another_replica_or_secret() -> None:
    async def go() -> None:
        app = Echo("a")
        server, port = await replica(app, "replica-a")
        try:
            rc, _, err = await probe("127.0.0.1", str(port), "replica-b", "GET", "/")
            assert rc == 1 and b"handshake" in err, err
            assert BINARY is not None
            proc = await asyncio.create_subprocess_exec(
                BINARY, "probe", "127.0.0.1", str(port), "replica-a", "GET", "/",
                env={"KUBESERVE_DATA_PLANE_SECRET": "another-secret-0123456789"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await proc.communicate()
            assert proc.returncode == 1 and b"wrong handshake proof" in err, err
            assert app.seen == []
        finally:
            server.close()

    run(go())


def test_the_rust_channel_client_takes_the_nodes_socket_of_a_replica_on_its_node(
    tmp_path: Path,
) -> None:
    """``KUBESERVE_NODE_SOCKETS`` (``spec.proxy.nodeLocalSockets``): a replica on the node is
    reached through ``<dir>/<host>-<port>.sock`` (here it listens there only), a stale file
    (nobody listening) falls back to TCP, and without the directory it is TCP."""

    async def probe_with(directory: Path | None, port: int) -> tuple[int, bytes, bytes]:
        assert BINARY is not None
        env = {channel.SECRET_ENV: SECRET.decode()}
        if directory is not None:
            # the Python name of the variable: the Rust client spells it too (channel.rs)
            env[local_socket.NODE_SOCKETS_ENV] = str(directory)
        proc = await asyncio.create_subprocess_exec(
            BINARY, "probe", "127.0.0.2", str(port), "replica-a", "GET", "/node",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out, err

    async def go() -> None:
        loop = asyncio.get_running_loop()
        app = Echo("a")
        port = free_port()  # no TCP listener on 127.0.0.2 there for the first two probes
        path = tmp_path / f"127.0.0.2-{port}.sock"
        serve = ReplicaHttpServer(app, control=app, secret=SECRET, identity="replica-a")
        server = await loop.create_unix_server(serve, str(path))
        try:
            rc, out, err = await probe_with(tmp_path, port)
            assert rc == 0, err
            assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"\r\n\r\nGET"), out
            assert [r.path for r in app.seen] == ["/node"]
            rc, _, err = await probe_with(None, port)  # another node's caller: TCP, refused
            assert rc == 1, err
        finally:
            server.close()
            await server.wait_closed()
        # the replica was killed: its file stays (nobody listens on it), refuses, and the
        # caller goes on with TCP
        if not path.exists():  # (a Python that removes it on close)
            leftover = socket.socket(socket.AF_UNIX)
            leftover.bind(str(path))
            leftover.close()
        tcp = await loop.create_server(serve, "127.0.0.2", 0)
        tcp_port = tcp.sockets[0].getsockname()[1]
        os.rename(path, tmp_path / f"127.0.0.2-{tcp_port}.sock")
        try:
            rc, out, err = await probe_with(tmp_path, tcp_port)
            assert rc == 0, err
            assert [r.path for r in app.seen] == ["/node", "/node"]
        finally:
            tcp.close()

    run(go())


# -- phase 2: the fast path in front of the Python proxy -----------------------------------------


# A replica stand-in: its identity and the protocol factory its server runs.
StandIn = tuple[str, Callable[[], asyncio.BaseProtocol]]


def echo_replica(app: Echo, identity: str, **options: Any) -> StandIn:
    """The real replica server (behind the channel handshake) running ``app``."""
    return identity, ReplicaHttpServer(
        app, control=app, secret=SECRET, identity=identity, **options
    )


def raw_replica(protocol: Callable[[], asyncio.Protocol], identity: str) -> StandIn:
    """A replica that behaves as ``protocol`` behind the real channel handshake."""
    return identity, lambda: ServerChannel(
        SECRET, identity, lambda role: protocol(), logging.getLogger()
    )


_LONG_KEEP_ALIVE: Mapping[str, Any] = {"keep_alive_timeout_s": 30.0}


class Front:
    """Replica stand-ins of deployment ``app#<deployment>`` on ``prefix``, the Python proxy and
    the native process in front of them, started and closed together.

    By default two echo replicas (``apps``) of ``app#D`` on ``/api``. ``proxy``: "beside" (the
    Python proxy and a native process handing off to it, as ``FastPath`` runs them), "owns" (a
    ``ProxyServer(native=True)``, which starts its own native process and pushes it the routes),
    or None (the native process alone, nothing to hand off to). ``push``: the settings of the
    first snapshot pushed to a "beside" or lone native process; None: none pushed."""

    def __init__(
        self,
        *,
        apps: list[Echo] | None = None,
        stand_ins: list[StandIn] | None = None,
        prefix: str = "/api",
        deployment: str = "D",
        max_ongoing: int = 8,
        proxy: Literal["beside", "owns"] | None = "beside",
        push: Mapping[str, Any] | None = _LONG_KEEP_ALIVE,
    ) -> None:
        if apps is None and stand_ins is None:
            apps = [Echo("a"), Echo("b")]
        self.apps = apps or []
        self.stand_ins = stand_ins or [
            echo_replica(app, f"replica-{app.name}") for app in self.apps
        ]
        self.prefix, self.deployment, self.max_ongoing = prefix, deployment, max_ongoing
        self.proxy_mode = proxy
        self.push = push
        self.servers: list[asyncio.Server] = []
        self.snapshot: Snapshot | None = None
        self.proxy: ProxyServer | None = None
        self.native: FastPath | None = None
        self.closed = False

    @property
    def port(self) -> int:
        """The port clients connect to: the native process's."""
        assert self.native is not None
        return self.native.port

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        endpoints = []
        for identity, factory in self.stand_ins:
            server = await loop.create_server(factory, "127.0.0.1", 0)
            self.servers.append(server)
            endpoints.append(_endpoint(identity, server.sockets[0].getsockname()[1]))
        snapshot = _snapshot(self.prefix, self.deployment, endpoints, self.max_ongoing)
        self.snapshot = snapshot
        source = StaticSource(snapshot)
        if self.proxy_mode == "owns":
            self.proxy = ProxyServer("127.0.0.1", 0, secret=SECRET, source=source, native=True)
            await self.proxy.start()
            self.native = self.proxy.native
            assert self.native is not None and self.proxy.port == self.native.port
            proxy = self.proxy
            await wait_until(lambda: proxy.native_version == 1, 5)  # the proxy's first push
            return
        handoff = 9  # the lone native process: nothing to hand off to
        if self.proxy_mode == "beside":
            self.proxy = ProxyServer("127.0.0.1", 0, secret=SECRET, source=source)
            await self.proxy.start()
            handoff = self.proxy.port
        self.native = FastPath(SECRET, "127.0.0.1", 0, handoff)
        await self.native.start()
        if self.push is not None:
            await self.native.push(snapshot, **self.push)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.native is not None and self.proxy_mode != "owns":
            await self.native.close()
        if self.proxy is not None:
            await self.proxy.close()
        for server in self.servers:
            server.close()


def scenario(body: Callable[[Front], Awaitable[None]], front: Front | None = None) -> None:
    """Run ``body`` against a started ``front`` (the default one when None), closed after."""

    async def go() -> None:
        f = Front() if front is None else front
        try:
            await f.start()
            await body(f)
        finally:
            await f.close()

    run(go())


class Conn:
    """A raw keep-alive client connection to the native process."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def request(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(raw)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await self.reader.read()
        return status, headers, body

    def close(self) -> None:
        self.writer.close()


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def test_keep_alive_requests_are_answered_natively_over_pooled_connections() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.native.port)
        replicas = []
        ids = set()
        for i in range(6):
            status, headers, answer = await conn.request(get(f"/api/x?i={i}"))
            assert status == 200 and answer == b"GET"
            assert headers["x-path"] == "/api/x" and headers["x-query"] == f"i={i}"
            replicas.append(headers["x-replica"])
            assert len(headers["x-request-id"]) == 32
            ids.add(headers["x-request-id"])
        assert len(ids) == 6  # a fresh id per request, the one the replica saw
        assert {r.request_id for a in f.apps for r in a.seen} == ids
        assert set(replicas) <= {"a", "b"}  # (two random choices: ties go either way)
        # the client's own id is kept
        status, headers, _ = await conn.request(get("/api", "X-Request-Id: my-id-1\r\n"))
        assert status == 200 and headers["x-request-id"] == "my-id-1"
        # a body, small and above 1 KiB (the HMAC-tagged frames)
        for size in (3, 20_000):
            payload = b"z" * size
            raw = b"POST /api/p HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size + payload
            status, _, answer = await conn.request(raw)
            assert status == 200 and answer == payload
        conn.close()
        stats = await f.native.stats()
        assert stats["answered"] == {"app#D": {"200": 9}}
        assert stats["handed_off"] == 0
        assert stats["upstream_connects"] == 2  # one pooled connection per replica

    scenario(body)


def test_chunked_answers_are_relayed_and_the_connection_goes_on() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.native.port)
        for _ in range(2):
            status, headers, answer = await conn.request(get("/api/stream"))
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            assert answer == b"part0;part1;part2;"
            status, _, answer = await conn.request(get("/api/after"))
            assert status == 200 and answer == b"GET"
        conn.close()
        assert (await f.native.stats())["handed_off"] == 0

    scenario(body)


def test_what_the_fast_path_does_not_cover_is_answered_by_the_python_proxy() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        port = f.native.port
        # an unknown route: the Python proxy's 404
        conn = await Conn.open(port)
        status, _, answer = await conn.request(get("/nowhere"))
        assert status == 404 and b"not found" in answer
        # the connection now belongs to the Python proxy, and keeps working
        status, headers, answer = await conn.request(get("/api/again"))
        assert status == 200 and answer == b"GET" and "x-request-id" in headers
        conn.close()
        # the proxy's own endpoints
        conn = await Conn.open(port)
        status, _, answer = await conn.request(get("/-/routes"))
        assert status == 200 and json.loads(answer) == {"/api": "app"}
        conn.close()
        # a chunked request body, after a request the fast path answered
        conn = await Conn.open(port)
        status, _, _ = await conn.request(get("/api/first"))
        assert status == 200
        raw = (
            b"POST /api/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        status, _, answer = await conn.request(raw)
        assert status == 200 and answer == b"abcde"
        conn.close()
        # a path that needs normalising: the Python proxy resolves it
        conn = await Conn.open(port)
        status, headers, _ = await conn.request(get("/api/a/../b"))
        assert status == 200 and headers["x-path"] == "/api/b"
        conn.close()
        stats = await f.native.stats()
        assert stats["handed_off"] == 4
        assert stats["answered"] == {"app#D": {"200": 1}}

    scenario(body)


def test_an_unserved_answer_is_handed_off_before_the_client_sees_it() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        f.apps[0].draining = True  # replica a answers "unserved": the Python proxy retries on b
        conn = await Conn.open(f.native.port)
        for _ in range(2):
            status, headers, answer = await conn.request(get("/api/x"))
            assert status == 200 and headers["x-replica"] == "b" and answer == b"GET"
        conn.close()

    scenario(body)


def test_new_state_is_pushed_live_and_bad_state_is_refused_with_the_field() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None and f.snapshot is not None
        snapshot: Any = json.loads(json.dumps(f.snapshot))
        snapshot["routes"].append({"route_prefix": "/", "app": "app", "deployment": "D"})
        await f.native.push(snapshot)
        conn = await Conn.open(f.native.port)
        status, headers, _ = await conn.request(get("/elsewhere"))
        assert status == 200 and headers["x-path"] == "/elsewhere"
        conn.close()
        assert (await f.native.stats())["handed_off"] == 0
        snapshot["deployments"]["app#D"]["replicas"][0]["port"] = "x"
        with pytest.raises(Exception, match=r"snapshot\.deployments\.app#D\.replicas\[0\]\.port"):
            await f.native.push(snapshot)

    scenario(body)


def test_nothing_is_accepted_before_the_first_snapshot() -> None:
    """As the Python proxy: a client connecting to a native process still waiting for its routes
    waits in the backlog (is neither handed off to a proxy still starting nor refused), then is
    served natively once the first snapshot is in."""

    async def body(f: Front) -> None:
        assert f.native is not None and f.snapshot is not None
        conn = await Conn.open(f.port)  # the kernel's backlog takes it
        waiting = asyncio.ensure_future(conn.request(get("/api/x")))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # not accepted: no answer, no hand-off, no close
        await f.native.push(f.snapshot)
        status, _, answer = await asyncio.wait_for(waiting, 10)
        assert status == 200 and answer == b"GET"
        assert (await f.native.stats())["handed_off"] == 0
        conn.close()

    scenario(body, Front(push=None))


# -- phase 3: the proxy's opt-in ------------------------------------------------------------------


def _requests_counted(route: str, status: str) -> float:
    """``ray_serve_num_http_requests`` of GETs of ``route``, as ``/metrics`` shows it."""
    labels = {"route": route, "method": "GET", "application": "app", "status_code": status}
    for family in text_string_to_metric_families(exposition().decode()):
        if family.name == "ray_serve_num_http_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and labels.items() <= sample.labels.items():
                    return float(sample.value)
    return 0.0


def test_a_proxy_with_the_native_data_path_serves_through_it_and_counts_in_its_metrics() -> None:
    async def body(f: Front) -> None:
        before = _requests_counted("/api", "200")
        native, proxy = f.native, f.proxy
        assert native is not None and proxy is not None
        conn = await Conn.open(proxy.port)
        for _ in range(5):
            status, _, answer = await conn.request(get("/api/x"))
            assert status == 200 and answer == b"GET"
        status, _, answer = await conn.request(get("/-/healthz"))  # the Python proxy's
        assert status == 200
        conn.close()
        stats = await native.stats()
        assert stats["answered"] == {"app#D": {"200": 5}} and stats["handed_off"] == 1
        # Ray's request counter, on the proxy's /metrics, counts what the native path answered
        await wait_until(lambda: _requests_counted("/api", "200") - before == 5, 5)
        pid = native.pid
        await f.close()
        # the proxy's close ends its native process
        assert proxy.native is None
        await wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5)

    scenario(body, Front(apps=[Echo("a")], proxy="owns"))


class _HangUp(asyncio.Protocol):
    """A replica that dies with the request: reads it, closes without an answer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        HANG_UPS.append(data)
        self.transport.close()


HANG_UPS: list[bytes] = []


def test_a_request_written_to_a_replica_that_hangs_up_is_a_502_never_run_twice() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.port)
        status, headers, answer = await conn.request(get("/x", "x-request-id: mine\r\n"))
        assert status == 502 and b"closed the connection before answering" in answer
        assert headers["x-request-id"] == "mine" and headers["connection"] == "close"
        assert await conn.reader.read() == b""
        conn.close()
        assert len(HANG_UPS) == 1  # the replica saw it once: not handed off, not retried
        assert (await f.native.stats())["answered"] == {"app#X": {"502": 1}}

    HANG_UPS.clear()
    stand_in = raw_replica(_HangUp, "replica-x")
    scenario(body, Front(stand_ins=[stand_in], prefix="/", deployment="X", push={}))


def test_a_pooled_connection_the_replica_closed_while_idle_is_not_reused() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.port)
        for _ in range(3):
            status, _, _ = await conn.request(get("/x"))
            assert status == 200
            await asyncio.sleep(0.4)  # the replica closes the idle upstream connection
        conn.close()
        stats = await f.native.stats()
        assert stats["answered"] == {"app#A": {"200": 3}} and stats["upstream_connects"] == 3

    app = Echo("a")
    stand_in = echo_replica(app, "replica-a", keep_alive_timeout_s=0.1)
    front = Front(apps=[app], stand_ins=[stand_in], prefix="/", deployment="A", proxy=None, push={})
    scenario(body, front)


def test_the_request_timeout_is_a_504_from_the_native_path() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None and f.snapshot is not None
        await f.native.push(f.snapshot, request_timeout_s=0.3)
        conn = await Conn.open(f.native.port)
        status, headers, answer = await conn.request(get("/api/sleep"))
        assert status == 504 and answer == b"request timed out"
        assert headers["connection"] == "close" and len(headers["x-request-id"]) == 32
        conn.close()
        await f.native.push(f.snapshot, request_timeout_s=None)  # off again
        conn = await Conn.open(f.native.port)
        status, _, _ = await conn.request(get("/api/sleep"))
        assert status == 200
        conn.close()
        stats = await f.native.stats()
        assert stats["answered"] == {"app#D": {"504": 1, "200": 1}}
        assert stats["handed_off"] == 0

    scenario(body)


def test_connection_keep_alive_is_served_natively_and_not_forwarded() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.native.port)
        for _ in range(2):
            status, _, answer = await conn.request(
                get("/api/k", "Connection: keep-alive\r\nX-Mine: 1\r\n")
            )
            assert status == 200 and answer == b"GET"
        conn.close()
        seen = [r for app in f.apps for r in app.seen]
        assert len(seen) == 2
        for request in seen:
            names = {name.lower() for name, _ in request.headers}
            assert "connection" not in names and "x-mine" in names
        stats = await f.native.stats()
        assert stats["handed_off"] == 0 and stats["answered"] == {"app#D": {"200": 2}}

    scenario(body)


def test_a_late_client_is_closed_or_handed_off_at_the_header_timeout() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None and f.snapshot is not None
        await f.native.push(f.snapshot, header_timeout_s=0.2, keep_alive_timeout_s=30.0)
        # a connection that sends nothing is closed at the header timeout, not the keep-alive one
        reader, writer = await asyncio.open_connection("127.0.0.1", f.native.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # half a head: the Python proxy takes the late client over (its own 408 and timeouts)
        reader, writer = await asyncio.open_connection("127.0.0.1", f.native.port)
        writer.write(b"GET /api/x HTTP/1.1\r\nHost:")
        await wait_until(async_handed_off(f, 1), 5)
        writer.close()

    scenario(body)


def async_handed_off(f: Front, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        assert f.native is not None
        return bool((await f.native.stats())["handed_off"] == count)

    return check


# -- parity with the Python proxy: load, connections, drain -------------------------------------


async def _in_flight_request(
    port: int, path: str
) -> asyncio.Task[tuple[int, dict[str, str], bytes]]:
    """A request on a connection of its own, answered in the background."""
    conn = await Conn.open(port)
    return asyncio.create_task(conn.request(get(path)))


def test_replica_choice_weighs_both_processes_requests_in_flight() -> None:
    async def body(f: Front) -> None:
        native = f.native
        assert native is not None
        # the Python proxy has replica a at its cap (8): every request goes to b
        assert await native.exchange_load({"replica-a": 8}) == {}
        conn = await Conn.open(native.port)
        for _ in range(4):
            status, headers, _ = await conn.request(get("/api/x"))
            assert status == 200 and headers["x-replica"] == "b"
        # both at their cap: handed to the Python proxy (which queues in a real proxy)
        await native.exchange_load({"replica-a": 8, "replica-b": 8})
        status, _, _ = await conn.request(get("/api/x"))
        assert status == 200 and (await native.stats())["handed_off"] == 1
        conn.close()
        await native.exchange_load({})
        # two at once: power of two choices over two replicas puts one on each
        first = await _in_flight_request(native.port, "/api/sleep")
        await wait_until(lambda: sum(len(a.seen) for a in f.apps) == 6, 5)
        # the native process reports its own requests in flight per replica
        ours = await native.exchange_load({})
        assert list(ours.values()) == [1], ours
        second = await _in_flight_request(native.port, "/api/sleep")
        answers = await asyncio.gather(first, second)
        assert {headers["x-replica"] for _, headers, _ in answers} == {"a", "b"}
        assert await native.exchange_load({}) == {}

    scenario(body)


def _ongoing() -> float:
    """``ray_serve_num_ongoing_http_requests``, as ``/metrics`` shows it."""
    for family in text_string_to_metric_families(exposition().decode()):
        if family.name == "ray_serve_num_ongoing_http_requests":
            return sum(float(sample.value) for sample in family.samples)
    return 0.0


def test_the_python_router_counts_the_native_requests_in_flight() -> None:
    async def body(f: Front) -> None:
        assert f.proxy is not None and f.proxy.native is not None
        router = f.proxy.state.router
        slow = await _in_flight_request(f.port, "/api/sleep")
        # the native request counts in the Python proxy's router, as its own would
        await wait_until(lambda: router.in_flight("app#D") == {"replica-a": 1}, 2)
        assert router.own_in_flight() == {}
        # and in Ray's ongoing-requests gauge of the proxy
        await wait_until(lambda: _ongoing() == 1, 2)
        status, _, _ = await slow
        assert status == 200
        await wait_until(lambda: router.in_flight("app#D") == {"replica-a": 0}, 2)
        await wait_until(lambda: _ongoing() == 0, 2)
        # and the Python proxy's own requests in flight reach the native process
        conn = await Conn.open(f.port)
        handed = asyncio.create_task(conn.request(get("/api/sleep", "TE: trailers\r\n")))
        await wait_until(lambda: router.own_in_flight() == {"replica-a": 1}, 5)
        assert await f.proxy.native.exchange_load({"replica-a": 1}) == {}
        assert (await handed)[0] == 200

    scenario(body, Front(apps=[Echo("a")], proxy="owns"))


_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 40\r\n\r\n"
    b"too many open connections to this proxy\n"
)


def test_max_connections_bounds_the_native_connections_as_the_python_proxy() -> None:
    async def body(f: Front) -> None:
        native = f.native
        assert native is not None and f.snapshot is not None
        await native.push(f.snapshot, max_connections=2)
        conns = [await Conn.open(native.port) for _ in range(2)]
        for conn in conns:  # both accepted and served
            assert (await conn.request(get("/api/x")))[0] == 200
        # the third is refused with the Python proxy's very bytes
        reader, writer = await asyncio.open_connection("127.0.0.1", native.port)
        assert await asyncio.wait_for(reader.read(), 5) == _REFUSAL
        writer.close()
        assert (await native.take_records()).refused == 1
        # a connection spliced to the Python proxy still counts
        status, _, _ = await conns[0].request(get("/nowhere"))
        assert status == 404
        reader, writer = await asyncio.open_connection("127.0.0.1", native.port)
        assert await asyncio.wait_for(reader.read(), 5) == _REFUSAL
        writer.close()
        conns[1].close()  # room again
        await wait_until(async_open_connections(f, 1), 5)
        conn = await Conn.open(native.port)
        assert (await conn.request(get("/api/x")))[0] == 200
        conn.close()
        conns[0].close()

    scenario(body)


def async_open_connections(f: Front, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        assert f.native is not None
        return bool((await f.native.stats())["open_connections"] == count)

    return check


def test_a_native_drain_finishes_requests_in_flight_and_closes_the_idle() -> None:
    async def body(f: Front) -> None:
        native = f.native
        assert native is not None
        idle = await Conn.open(native.port)
        assert (await idle.request(get("/api/x")))[0] == 200
        late = await Conn.open(native.port)
        assert (await late.request(get("/api/x")))[0] == 200
        busy = [await _in_flight_request(native.port, "/api/sleep") for _ in range(4)]
        await wait_until(lambda: sum(len(a.seen) for a in f.apps) == 6, 5)
        draining = asyncio.create_task(native.drain(10))
        await wait_until(lambda: async_draining(f), 5)
        # no new connection
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", native.port)
        # a request on an idle connection within a second: answered, with Connection: close
        status, headers, _ = await late.request(get("/api/x"))
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(late.reader.read(), 5) == b""
        # the requests in flight finish, each saying Connection: close
        for status, headers, answer in await asyncio.gather(*busy):
            assert status == 200 and headers["connection"] == "close" and answer == b"GET"
        # the idle connection is closed after a second
        assert await asyncio.wait_for(idle.reader.read(), 5) == b""
        assert await draining is True
        assert (await native.stats())["open_connections"] == 0

    scenario(body)


async def async_draining(f: Front) -> bool:
    assert f.native is not None
    return bool((await f.native.stats())["draining"])


def test_a_leaving_proxy_drains_its_native_data_path_with_no_failed_request() -> None:
    async def body(f: Front) -> None:
        assert f.proxy is not None
        native_port = f.port
        # in flight: native requests, and one the Python proxy serves (handed off)
        busy = [await _in_flight_request(native_port, "/api/sleep") for _ in range(3)]
        conn = await Conn.open(native_port)
        busy.append(asyncio.create_task(conn.request(get("/api/sleep", "TE: trailers\r\n"))))
        await wait_until(lambda: len(f.apps[0].seen) == 4, 5)
        started = asyncio.get_running_loop().time()
        await f.proxy.leave(LeavePlan(drain_s=10))
        assert asyncio.get_running_loop().time() - started < 5
        answers = await asyncio.gather(*busy, return_exceptions=True)
        assert [a[0] for a in answers if isinstance(a, tuple)] == [200] * 4, answers
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", native_port)

    scenario(body, Front(apps=[Echo("a")], proxy="owns"))


class _UntilClose(asyncio.Protocol):
    """A replica whose answer has neither a length nor chunks: its body ends with the connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end")  # type: ignore[attr-defined]
        self.transport.close()


def test_an_answer_that_ends_with_the_connection_ends_the_clients_as_the_python_proxy() -> None:
    async def body(f: Front) -> None:
        assert f.native is not None
        conn = await Conn.open(f.port)
        # the client learns where the body ends by the close, and the answer says so
        status, headers, answer = await conn.request(get("/x"))
        assert status == 200 and answer == b"to the end"
        assert headers["connection"] == "close"
        conn.close()
        assert (await f.native.stats())["answered"] == {"app#X": {"200": 1}}

    stand_in = raw_replica(_UntilClose, "replica-x")
    scenario(body, Front(stand_ins=[stand_in], prefix="/", deployment="X", push={}))


def test_a_request_that_finds_every_replica_full_waits_in_the_python_proxys_queue() -> None:
    """What the autoscaler counts: replicas report what they run (native requests included), the
    proxy reports what waits in its router's queue, where the native path's overflow goes."""

    async def body(f: Front) -> None:
        assert f.proxy is not None and f.proxy.native is not None
        app = f.apps[0]
        router = f.proxy.state.router
        first = await _in_flight_request(f.port, "/api/sleep")
        await wait_until(lambda: router.in_flight("app#D") == {"replica-a": 1}, 2)
        # the replica is at its cap: the native path hands the next one over, it waits
        second = await _in_flight_request(f.port, "/api/sleep")
        await wait_until(lambda: router.queued("app#D") == 1, 2)
        assert len(app.seen) == 1  # not sent to the full replica
        for status, _, _ in await asyncio.gather(first, second):
            assert status == 200
        assert router.queued("app#D") == 0 and len(app.seen) == 2
        assert (await f.proxy.native.stats())["handed_off"] == 1

    scenario(body, Front(apps=[Echo("a")], proxy="owns", max_ongoing=1))


_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
_LATENCY = re.compile(r" \d+\.\dms")


def _entry_of(line: str, json_line: bool) -> tuple[float, str, str, int, float, str]:
    """The access entry a line says: (time, method, route, status, latency ms, request id); the
    time half a millisecond into the millisecond the line names."""
    if json_line:
        record = json.loads(line)
        stamp, message, rid = record["asctime"], record["message"], record.get("request_id", "")
    else:
        stamp = _STAMP.search(line)[0]  # type: ignore[index]
        head, _, message = line.partition(" -- ")
        rid = head.split(" ")[5] if len(head.split(" ")) == 6 else ""
    second, _, millis = stamp.partition(",")
    at = time.mktime(time.strptime(second, "%Y-%m-%d %H:%M:%S")) + (int(millis) + 0.5) / 1000
    method, route, status, latency = message.split(" ")
    return at, method, route, int(status), float(latency.removesuffix("ms")), rid


@pytest.mark.parametrize("encoding", ["TEXT", "JSON"])
def test_native_access_lines_are_the_python_proxys_for_the_same_requests(
    encoding: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native process formats its access lines itself (``native/src/access.rs``) and hands
    them over as one text: the same requests through the Python proxy and through the native
    process read alike but for their time and latency, and each native line is byte for byte
    what the Python proxy's ``AccessLog`` writes for its entry."""
    handler = logging.FileHandler(tmp_path / "proxy.log", encoding="utf-8")
    monkeypatch.setattr(logs, "_output", handler)
    access = logs.AccessLog(logs.ComponentLog("proxy", "proxy", "node-1"), encoding)
    requests = [
        get("/api/x", "x-request-id: req-1\r\n"),
        b"POST /api/y/z HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nx-request-id: req-2\r\n\r\nhi",
        get("/api", "x-request-id: a.b:c@d/e+f=g~h-_9\r\n"),
    ]

    async def send(port: int, extra: tuple[bytes, ...] = ()) -> None:
        conn = await Conn.open(port)
        for raw in [*requests, *extra]:
            assert (await conn.request(raw))[0] == 200
        conn.close()

    async def body(f: Front) -> None:
        native, proxy = f.native, f.proxy
        assert native is not None and proxy is not None and f.snapshot is not None
        proxy.state.access_log = access  # the Python proxy beside it writes its own lines
        await native.push(f.snapshot, access_log=True, access_format=access.native_format())
        await send(proxy.port)
        access.flush()
        python = (tmp_path / "proxy.log").read_text().splitlines()
        await send(native.port, (get("/api/q"),))  # the last: an id generated natively
        taken = (await native.take_records()).access
        assert taken.endswith("\n") and (await native.take_records()).access == ""
        ours = taken.splitlines()
        assert len(python) == 3 and len(ours) == 4, (python, ours)

        def masked(line: str) -> str:
            return _LATENCY.sub(" Lms", _STAMP.sub("T", line))

        assert [masked(line) for line in ours[:3]] == [masked(line) for line in python]
        json_line = encoding == "JSON"
        for line in ours:
            at, method, route, status, latency_ms, rid = _entry_of(line, json_line)
            assert route == "/api" and (status, len(rid) > 0) == (200, True)
            entry = (at, method, route, status, latency_ms, rid, route)
            expected = access._format.lines([entry])[0]
            assert line + "\n" == expected
        # off: none kept
        await native.push(f.snapshot, access_log=False)
        await send(native.port)
        assert (await native.take_records()).access == ""

    scenario(body)
