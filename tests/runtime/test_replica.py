"""The replica process over real HTTP: user traffic, /-/ endpoints, start-up failure, SIGTERM.

Every connection passes the real data-plane handshake: user traffic on an ``INGRESS`` channel (as a
proxy sends it), internal endpoints on a ``CONTROL`` one (as the controller and handles do).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeserve.control.user_config import user_config_version
from kubeserve.runtime import channel, wire
from kubeserve.sdk.ray_errors import RayError, RayTaskError
from support.channel_front import SECRET
from support.common import free_port, wait_for
from support.kubeserve_start import PickleMarker
from support.replica_process import replica_config, replica_env
from support.sealed_socket import SealedSocket, sealed_socket

ROOT = Path(__file__).resolve().parents[2]


class ReplicaProcess:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        timeout: float = 10,
        role: channel.Role | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh authenticated connection; ``role`` defaults to CONTROL for
        internal endpoints and INGRESS for anything else."""
        if role is None:
            role = channel.Role.CONTROL if path.startswith("/-/") else channel.Role.INGRESS
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.sock = authenticated(self.port, role, timeout)  # type: ignore[assignment]
        try:
            conn.putrequest(method, path)
            pairs = headers.items() if isinstance(headers, dict) else headers or []
            for name, value in pairs:
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return self.request("GET", path)

    def call(self, method: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        status, _, body = self.request(
            "POST", wire.CALL_PREFIX + method, wire.encode_call(args, kwargs)
        )
        return status, wire.decode_result(body) if status in (200, 500) else body

    def metric(self, name: str) -> float:
        _, _, body = self.get(wire.METRICS_PATH)
        for line in body.decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"metric {name} missing from {body!r}")


def authenticated(port: int, role: channel.Role, timeout: float = 10) -> SealedSocket:
    """A blocking sealed connection to the replica ``r-1`` on ``port``, past the handshake."""
    return sealed_socket(port, role, SECRET, "r-1", timeout)


def spawn(
    config: wire.ReplicaConfig, port: int, environ: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A replica process; without ``environ`` (the test's environment) it has no controller."""
    env = replica_env(config, environ)
    cmd = [sys.executable, "-m", "kubeserve.runtime.replica", "--host", "127.0.0.1"]
    return subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def wait_ready(replica: ReplicaProcess, deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if replica.proc.poll() is not None:
            raise AssertionError(f"replica exited: {replica.proc.stderr.read()!r}")  # type: ignore[union-attr]
        try:
            if replica.get(wire.HEALTHZ_PATH)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("replica did not become healthy")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=10)


@pytest.fixture
def start() -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def run(import_path: str, deployment: str, **overrides: Any) -> ReplicaProcess:
        port = free_port()
        proc = spawn(replica_config(import_path, deployment, **overrides), port)
        started.append(proc)
        replica = ReplicaProcess(proc, port)
        wait_ready(replica)
        return replica

    yield run
    for proc in started:
        stop(proc)


@pytest.fixture
def echo(start: Any) -> ReplicaProcess:
    replica: ReplicaProcess = start("ks_echo_app:app", "Echo", user_config={"greeting": "hello"})
    return replica


def test_return_types_become_http_responses(echo: ReplicaProcess) -> None:
    status, headers, body = echo.get("/str")
    assert (status, headers["content-type"], body) == (200, "text/plain; charset=utf-8", b"> hello")
    status, headers, body = echo.get("/bytes")
    assert (headers["content-type"], body) == ("application/octet-stream", b"\x00\x01raw")
    status, headers, body = echo.get("/dict")
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["greeting"] == "hello"
    status, headers, body = echo.get("/none")
    assert (status, body) == (200, b"")
    status, headers, body = echo.get("/response")
    assert (status, headers["x-kind"], body) == (201, "custom", b"created")
    status, headers, body = echo.get("/json")
    assert (status, json.loads(body)) == (202, {"a": [1, 2]})
    assert echo.get("/text")[1]["content-type"] == "text/plain; charset=utf-8"


def test_async_handlers_run_in_a_task_from_their_first_step(echo: ReplicaProcess) -> None:
    """asyncio.timeout, a TaskGroup (and aiohttp's and anyio's timeouts) need the current task;
    Ray runs each request in one."""
    status, _, body = echo.get("/timeout")
    assert (status, json.loads(body)) == (200, {"task": True, "child": "child"})
    assert echo.get("/timedstream")[:3:2] == (200, b"0\n1\n")


def test_generators_stream_chunked(echo: ReplicaProcess) -> None:
    status, headers, body = echo.get("/stream?n=4")
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert body == b"0\n1\n2\n3\n"
    assert echo.get("/syncstream")[2] == b"abc"


def test_request_surface(echo: ReplicaProcess) -> None:
    status, _, body = echo.request(
        "POST",
        "/api/inspect?tag=a&tag=b&x=1",
        json.dumps({"k": "v"}).encode(),
        [
            ("X-Token", "t0k"),
            ("X-Multi", "1"),
            ("x-multi", "2"),
            ("Content-Type", "application/json"),
        ],
    )
    assert status == 200
    seen = json.loads(body)
    assert seen == {
        "method": "POST",
        "path": "/api/inspect",
        "query": "tag=a&tag=b&x=1",
        "tags": ["a", "b"],
        "x_token": "t0k",
        "x_multi": ["1", "2"],
        "body": '{"k": "v"}',
        "json": {"k": "v"},
    }


def test_a_plain_ingress_pays_for_starlette_and_handles_only_when_it_uses_them() -> None:
    """A replica whose code reads only kubeserve's Request surface and calls no other deployment
    loads neither Starlette nor the handle client (and never reaches the controller: the one
    named here does not listen); reading more of the request makes it a Starlette request."""
    port = free_port()
    env = {**os.environ, wire.CONTROLLER_URL_ENV: f"http://127.0.0.1:{free_port()}"}
    proc = spawn(replica_config("ks_light_app:app", "Light"), port, env)
    replica = ReplicaProcess(proc, port)
    try:
        wait_ready(replica)
        assert json.loads(replica.get("/")[2]) == {"loaded": []}
        status, _, body = replica.request(
            "GET", "/cookies", headers={"Cookie": "session=abc; theme=dark"}
        )
        assert status == 200, body
        assert json.loads(body) == {"cookies": {"session": "abc", "theme": "dark"}, "scope": "http"}
        assert json.loads(replica.get("/")[2]) == {"loaded": ["starlette"]}
        status, _, body = replica.request("GET", "/headers", headers={"X-Token": "t0k"})
        assert json.loads(body) == {"token": "t0k", "path": "/headers"}
    finally:
        stop(proc)


def test_user_exception_is_a_500_naming_only_the_request_id(echo: ReplicaProcess) -> None:
    # The exception's text may hold secrets: the client gets the request id, the log the rest.
    status, headers, body = echo.request("GET", "/boom", headers={"X-Request-Id": "rid-boom-1"})
    assert (status, body) == (500, b"Internal Server Error (request id rid-boom-1)")
    assert headers["x-request-id"] == "rid-boom-1"
    status, headers, body = echo.get("/boom")  # without one, the replica makes one up
    assert status == 500 and b"exploded" not in body
    assert body == b"Internal Server Error (request id %s)" % headers["x-request-id"].encode()
    assert echo.get("/str")[0] == 200  # the replica keeps serving
    echo.proc.kill()
    assert echo.proc.stderr is not None
    log = echo.proc.stderr.read().decode()
    failure = next(line for line in log.splitlines() if "rid-boom-1" in line)
    assert "GET /boom failed" in failure
    assert "ValueError: user code exploded" in log.split(failure, 1)[1]  # the traceback follows


def test_every_user_response_carries_the_callers_request_id(echo: ReplicaProcess) -> None:
    _, headers, _ = echo.request("GET", "/str", headers={"X-Request-Id": "abc-123"})
    assert headers["x-request-id"] == "abc-123"
    _, headers, _ = echo.request("GET", "/stream?n=2", headers={"x-request-id": "s-1"})
    assert headers["x-request-id"] == "s-1"


def test_healthz_runs_check_health(echo: ReplicaProcess) -> None:
    status, _, body = echo.get(wire.HEALTHZ_PATH)
    assert status == 200 and json.loads(body)["status"] == "ok"
    echo.get("/sick")
    status, _, body = echo.get(wire.HEALTHZ_PATH)
    assert (status, body) == (503, b"RuntimeError: marked unhealthy")


def test_reconfigure_changes_answers_in_place(echo: ReplicaProcess) -> None:
    pid = json.loads(echo.get("/dict")[2])["pid"]
    payload = json.dumps({"user_config": {"greeting": "bonjour"}}).encode()
    assert echo.request("POST", wire.RECONFIGURE_PATH, payload)[0] == 200
    answer = json.loads(echo.get("/dict")[2])
    assert answer == {"greeting": "bonjour", "pid": pid, "reconfigured": 2}  # start, then this

    failing = json.dumps({"user_config": {"fail": True}}).encode()
    status, _, body = echo.request("POST", wire.RECONFIGURE_PATH, failing)
    assert (status, body) == (500, b"ValueError: bad user_config")
    assert echo.request("POST", wire.RECONFIGURE_PATH, b"not json")[0] == 400


def test_the_replica_reports_the_user_config_it_applied_and_applies_a_version_once(
    echo: ReplicaProcess,
) -> None:
    started = user_config_version({"greeting": "hello"})  # the fixture's, applied at start
    assert wire.applied_user_config(echo.get(wire.HEALTHZ_PATH)[2]) == started
    assert json.loads(echo.get("/dict")[2])["reconfigured"] == 1
    # The same value again (in another key order, as a controller may send it): nothing runs.
    same = json.dumps({"user_config": {"greeting": "hello"}}).encode()
    status, _, body = echo.request("POST", wire.RECONFIGURE_PATH, same)
    assert status == 200 and wire.applied_user_config(body) == started
    assert json.loads(echo.get("/dict")[2])["reconfigured"] == 1
    new = {"greeting": "salut"}
    status, _, body = echo.request(
        "POST", wire.RECONFIGURE_PATH, json.dumps({"user_config": new}).encode()
    )
    assert status == 200 and wire.applied_user_config(body) == user_config_version(new)
    assert wire.applied_user_config(echo.get(wire.HEALTHZ_PATH)[2]) == user_config_version(new)
    assert json.loads(echo.get("/dict")[2])["reconfigured"] == 2


def test_metrics_count_requests(echo: ReplicaProcess) -> None:
    before = echo.metric("kubeserve_replica_processed_requests_total")
    echo.get("/str")
    echo.call("add", 1, 2)
    assert echo.metric("kubeserve_replica_processed_requests_total") == before + 2
    assert echo.metric("kubeserve_replica_ongoing_requests") == 0
    # each request counted from its start to its end: the integral the autoscaler reads grew
    area = echo.metric("kubeserve_replica_ongoing_request_seconds_total")
    assert area > 0
    echo.get("/str")
    assert echo.metric("kubeserve_replica_ongoing_request_seconds_total") > area
    assert echo.metric("kubeserve_replica_max_ongoing_requests") == 5
    _, headers, body = echo.get(wire.METRICS_PATH)
    assert headers["content-type"].startswith("text/plain")
    assert 'deployment="Echo"' in body.decode()


def test_handle_calls(echo: ReplicaProcess) -> None:
    assert echo.call("add", 2, b=40) == (200, 42)
    assert echo.call("later") == (200, True)  # a coroutine a plain method returns: in a task
    assert echo.call("bounded") == (200, True)  # an async method runs in a task from its start
    status, error = echo.call("fail")
    assert status == 500  # Ray's RayTaskError: the cause, and the traceback of where it ran
    assert isinstance(error, RayTaskError) and error.cause.args == ("missing thing",)
    assert isinstance(error.cause, KeyError)
    assert error.function_name == "ServeReplica:default:Echo.fail"
    assert "KeyError: 'missing thing'" in str(error) and "line" in str(error)
    status, error = echo.call("fail_unpicklable")
    assert status == 500 and "Unpicklable: cannot ship this" in str(error)
    assert isinstance(error, RayTaskError) and type(error.cause) is RayError
    assert echo.call("no_such_method")[0] == 404
    assert echo.call("__init__")[0] == 404
    assert echo.request("POST", wire.CALL_PREFIX + "add", b"garbage")[0] == 400


def test_function_deployment(start: Any) -> None:
    replica: ReplicaProcess = start("ks_echo_app:function_app", "hello")
    assert replica.get("/x/y")[2] == b"hello from a function at /x/y"


CONVENTIONS = "ray_calling_conventions_app:"


@pytest.mark.parametrize(
    ("app", "deployment", "path", "answer"),
    [
        ("no_request", "NoRequest", "/", b"hi"),  # Ray calls it without the request
        ("async_no_request", "AsyncNoRequest", "/", b'{"async":true}'),
        ("no_request_function_app", "no_request_function", "/", b"hi from a function"),
        ("async_function_app", "async_function", "/a/b", b"async function at /a/b"),
        ("var_args", "VarArgs", "/", b"1 True"),  # *args: it takes the request
        ("async_generator", "AsyncGenerator", "/?n=4", b"0\n1\n2\n3\n"),
    ],
)
def test_every_http_calling_convention_of_rays_replica(
    start: Any, app: str, deployment: str, path: str, answer: bytes
) -> None:
    replica: ReplicaProcess = start(CONVENTIONS + app, deployment)
    status, _, body = replica.get(path)
    assert (status, body) == (200, answer)


def test_a_sync_generator_handler_blocking_between_chunks_does_not_stall_the_replica(
    start: Any,
) -> None:
    replica: ReplicaProcess = start(CONVENTIONS + "blocking_generator", "BlockingGenerator")
    conn = http.client.HTTPConnection("127.0.0.1", replica.port, timeout=20)
    conn.sock = authenticated(replica.port, channel.Role.INGRESS)  # type: ignore[assignment]
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert (resp.status, resp.readline()) == (200, b"waiting\n")
        # The generator now blocks its thread until this request is served: on the event loop
        # it would block that too, and this request would wait for the generator's timeout.
        status, _, body = replica.request("GET", "/release", timeout=5)
        assert (status, body) == (200, b"released")
        assert resp.read() == b"released\n"
    finally:
        conn.close()


def test_a_sync_handler_blocking_its_thread_does_not_hold_back_the_next_request(
    start: Any,
) -> None:
    """A plain method runs in a worker thread (off the event loop) in its request's context; a
    call arriving while the only worker is blocked in one gets a thread of its own within
    milliseconds (the first call was the only one queued when its worker was woken)."""
    replica: ReplicaProcess = start(CONVENTIONS + "blocking_handler", "BlockingHandler")
    assert replica.get("/release")[2] == b"released"  # the worker thread exists, and is idle
    answers: list[tuple[int, dict[str, str], bytes]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            replica.request(
                "GET", "/wait", headers={"serve_multiplexed_model_id": "m-7"}, timeout=20
            )
        )
    )
    waiting.start()
    try:
        # Once /wait blocks its thread, /release is served by another one; before, it is served
        # first and /wait (which clears the event) waits out its 10 s: retry until it is not.
        def released_while_waiting() -> bool:
            status, _, body = replica.request("GET", "/release", timeout=5)
            assert (status, body) == (200, b"released")
            return not waiting.is_alive() or bool(answers)

        wait_for(released_while_waiting, 8, 0.05)
    finally:
        waiting.join(timeout=15)
    status, _, body = answers[0]
    assert status == 200
    assert json.loads(body) == {
        "released": True,
        "on_loop": False,
        "model": "m-7",
        "deployment": "BlockingHandler",
    }


def test_composed_app_constructs_with_handles(start: Any) -> None:
    replica: ReplicaProcess = start("ks_composed_app:app", "Model")
    assert replica.call("predict", 21) == (200, 42)
    ingress: ReplicaProcess = start("ks_composed_app:app", "Ingress")
    status, _, body = ingress.get("/?q=hi")
    assert status == 500  # no controller: the handle has no transport in this process
    assert body.startswith(b"Internal Server Error (request id ")


def test_constructor_error_exits_1_with_the_message() -> None:
    proc = spawn(replica_config("ks_ctor_error:app", "Broken"), free_port())
    try:
        _, stderr = proc.communicate(timeout=20)
    finally:
        stop(proc)
    assert proc.returncode == 1
    assert b"RuntimeError: constructor refused to start" in stderr
    assert b"ks_ctor_error.py" in stderr


def test_unknown_deployment_and_broken_import_exit_1() -> None:
    for import_path, deployment, text in [
        ("ks_echo_app:app", "Nope", b"'Nope' is not in the application"),
        ("ks_broken_import:app", "X", b"No module named 'kubeserve_no_such_module'"),
    ]:
        proc = spawn(replica_config(import_path, deployment), free_port())
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 1
        assert text in stderr


def test_sigterm_finishes_the_request_in_flight(start: Any) -> None:
    replica: ReplicaProcess = start(
        "ks_echo_app:app",
        "Echo",
        graceful_shutdown_wait_loop_s=0.05,
        graceful_shutdown_timeout_s=10.0,
    )
    result: dict[str, Any] = {}

    def slow() -> None:
        result["response"] = replica.get("/slow?s=1")

    thread = threading.Thread(target=slow)
    thread.start()
    sent = _sigterm_while_busy(replica)
    thread.join(timeout=5)
    assert result["response"][0] == 200 and result["response"][2] == b"slow done"
    assert time.monotonic() - sent < 5
    with pytest.raises(OSError):
        replica.get("/str")


def test_with_a_leave_delay_a_signalled_replica_serves_new_requests_then_drains(
    start: Any,
) -> None:
    """On Kubernetes the proxies learn of a terminating pod after its SIGTERM: meanwhile it takes
    new connections and requests as before, and only then drains."""
    replica: ReplicaProcess = start("ks_echo_app:app", "Echo", leave_delay_s=1.0)
    signalled = time.monotonic()
    replica.proc.send_signal(signal.SIGTERM)
    assert replica.get("/str")[0] == 200  # a new connection, after the signal
    assert time.monotonic() - signalled < 1.0
    replica.proc.wait(timeout=10)
    assert time.monotonic() - signalled >= 1.0


def test_sigterm_gives_up_at_the_graceful_timeout(start: Any) -> None:
    replica: ReplicaProcess = start(
        "ks_echo_app:app",
        "Echo",
        graceful_shutdown_wait_loop_s=0.05,
        graceful_shutdown_timeout_s=0.5,
    )
    thread = threading.Thread(target=lambda: _ignore_errors(replica.get, "/slow?s=30"))
    thread.start()
    sent = _sigterm_while_busy(replica)
    assert time.monotonic() - sent < 3
    thread.join(timeout=5)


def _ignore_errors(fn: Any, *args: Any) -> None:
    with contextlib.suppress(OSError):
        fn(*args)


def _raw_exchange(sock: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` and read until the peer closes (or 5 s pass)."""
    sock.settimeout(5)
    with contextlib.suppress(OSError):
        sock.sendall(payload)
    received = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
    sock.close()
    return received


def test_unauthenticated_peers_are_cut_off_before_anything_is_parsed(
    echo: ReplicaProcess, tmp_path: Path
) -> None:
    import pickle

    marker = tmp_path / "pwned"
    body = pickle.dumps(((PickleMarker(marker),), {}))
    call = b"POST /-/call/add HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    # Plain HTTP on the TCP port and on the same-host unix socket: no answer, nothing unpickled.
    tcp = socket.create_connection(("127.0.0.1", echo.port))
    assert _raw_exchange(tcp, call) == b""
    name = wire_socket_name(echo.port)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.connect(name)
    assert _raw_exchange(unix, call) == b""
    # A peer that knows the protocol but not the secret fails the handshake.
    with pytest.raises(channel.ChannelError):
        asyncio.run(
            channel.open_socket("127.0.0.1", echo.port, channel.Role.CONTROL, b"x" * 32, "r-1")
        )
    assert not marker.exists()
    assert echo.get("/str")[0] == 200  # and the replica serves its own callers as before


def test_ingress_connections_never_reach_internal_endpoints(echo: ReplicaProcess) -> None:
    ingress = channel.Role.INGRESS
    # On a proxy's channel every path is user traffic: the user's __call__ answers it.
    for path in (wire.CALL_PREFIX + "add", "/%2D/call/add", wire.RECONFIGURE_PATH, "/-/metrics"):
        status, _, body = echo.request("POST", path, b"{}", role=ingress)
        assert status == 200, path
        assert body.decode().startswith("unknown "), (path, body)
    payload = json.dumps({"user_config": {"greeting": "hijacked"}}).encode()
    echo.request("POST", wire.RECONFIGURE_PATH, payload, role=ingress)
    assert echo.get("/str")[2] == b"> hello"  # user_config untouched
    # A CONTROL channel carries internal endpoints only: user paths are not served there.
    assert echo.request("GET", "/str", role=channel.Role.CONTROL)[0] == 404


def test_the_secret_is_not_left_to_user_code(echo: ReplicaProcess) -> None:
    keys = json.loads(echo.get("/environ")[2])["keys"]
    assert channel.SECRET_ENV not in keys and channel.SECRET_FILE_ENV not in keys


def test_a_replica_without_the_secret_refuses_to_start() -> None:
    config = replica_config("ks_echo_app:app", "Echo")
    env = dict(os.environ)
    env[wire.REPLICA_CONFIG_ENV] = json.dumps(config)
    env.pop(channel.SECRET_ENV, None)
    env.pop(channel.SECRET_FILE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "tests" / "apps")])
    cmd = [sys.executable, "-m", "kubeserve.runtime.replica", "--port", str(free_port())]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert done.returncode == 1
    assert channel.SECRET_ENV.encode() in done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_a_unix_socket_squatted_by_another_user_is_not_used() -> None:
    port = free_port()
    name = wire_socket_name(port)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the squatter: another uid, holding the replica's socket name
        try:
            os.setuid(65534)
            squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            squat.bind(name)
            squat.listen(8)
            os.write(ready_w, b"1")
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        from kubeserve.runtime import local_socket

        assert local_socket.connect_socket("127.0.0.1", port) is None  # TCP is used instead
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def wire_socket_name(port: int) -> str:
    from kubeserve.runtime import local_socket

    name = local_socket.socket_name("127.0.0.1", port)
    assert name is not None
    return name


def _sigterm_while_busy(replica: ReplicaProcess) -> float:
    """Once ``replica`` runs a request, SIGTERM it and wait for a clean exit; when it was sent."""
    wait_for(lambda: replica.metric("kubeserve_replica_ongoing_requests") >= 1, 5, 0.01)
    sent = time.monotonic()
    replica.proc.send_signal(signal.SIGTERM)
    assert replica.proc.wait(timeout=10) == 0
    return sent


def test_multiplexed_answers_name_the_models_the_replica_holds(start: Any) -> None:
    """What callers' routers learn from (``wire.MODELS_HEADER``): the models held once the
    replica answered, most recently used first; only in answers to requests naming a model."""
    replica: ReplicaProcess = start("ray_multiplex_app:inferencer_app", "ModelInferencer")

    def models_after(model_id: str) -> str | None:
        status, headers, body = replica.request(
            "GET", "/", headers={"serve_multiplexed_model_id": model_id}
        )
        assert status == 200, body
        return headers.get(wire.MODELS_HEADER)

    assert models_after("m1") == "m1"
    assert models_after("m,2") == "m%2C2,m1"
    assert models_after("m1") == "m1,m%2C2"
    assert models_after("m3") == "m3,m1"  # two at most: m,2 was evicted
    status, headers, _ = replica.request(
        "POST", wire.CALL_PREFIX + "predict", wire.encode_call(("x",), {}, {"model_id": "m4"})
    )
    assert status == 200 and headers[wire.MODELS_HEADER] == "m4,m3"
    status, headers, _ = replica.request(
        "POST", wire.CALL_PREFIX + "predict", wire.encode_call(("x",), {}, {"request_id": "r"})
    )
    assert status == 200 and wire.MODELS_HEADER not in headers  # no model named, none told


def test_a_streamed_multiplexed_call_names_the_model_its_generator_loaded(start: Any) -> None:
    replica: ReplicaProcess = start("ray_multiplex_routing_app:models_app", "Models")
    status, headers, body = replica.request(
        "POST", wire.STREAM_PREFIX + "stream_predict", wire.encode_call((7,), {}, {"model_id": "s"})
    )
    assert status == 200 and headers[wire.MODELS_HEADER] == "s"  # loaded by the first item
    frames = list(wire.FrameReader().feed(body))
    assert [kind for kind, _ in frames] == [wire.FRAME_ITEM, wire.FRAME_END]
    assert wire.decode_result(frames[0][1])["x"] == 7


def _read_answers(file: Any, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` HTTP/1.1 answers (with a Content-Length each) read in turn from ``file``."""
    answers = []
    for _ in range(count):
        status = int(file.readline().split()[1])
        headers = {}
        while (line := file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        answers.append((status, headers, file.read(int(headers["content-length"]))))
    return answers


def test_a_plain_handlers_answers_come_back_whole_and_in_order_however_they_are_written(
    start: Any,
) -> None:
    """A plain ``__call__``'s ``str`` answer is written by its worker thread; a dict, an
    exception, or what the socket does not take at once (a 3 MB answer) by the event loop.
    Requests pipelined on one connection, every kind mixed, get their answers in order, each
    whole, with its own request id; the replica counts every one done."""
    replica: ReplicaProcess = start(CONVENTIONS + "sync_answers", "SyncAnswers")
    kinds = [
        ("text", "1"), ("raise", ""), ("dict", "3"), ("big", "3000000"), ("text", "5"),
        ("big", "70000"), ("text", "7"),
    ] * 3  # fmt: skip
    sock = authenticated(replica.port, channel.Role.INGRESS, timeout=30)
    try:
        sock.sendall(
            b"".join(
                b"GET /?kind=%s&n=%s HTTP/1.1\r\nHost: r\r\nX-Request-Id: rid-%d\r\n\r\n"
                % (kind.encode(), n.encode(), i)
                for i, (kind, n) in enumerate(kinds)
            )
        )
        answers = _read_answers(sock.makefile("rb"), len(kinds))
    finally:
        sock.close()
    for i, ((kind, n), (status, headers, body)) in enumerate(zip(kinds, answers, strict=True)):
        assert headers["x-request-id"] == f"rid-{i}"
        if kind == "text":
            assert (status, headers["content-type"], body) == (
                200, "text/plain; charset=utf-8", f"text {n}".encode(),
            )  # fmt: skip
        elif kind == "big":
            assert (status, body) == (200, b"x" * int(n))
        elif kind == "dict":
            assert (status, json.loads(body)) == (200, {"n": n})
        else:
            assert status == 500 and b"rid-" in body
    assert replica.metric("kubeserve_replica_processed_requests_total") >= len(kinds)
    assert replica.metric("kubeserve_replica_ongoing_requests") == 0


def test_a_plain_handler_at_max_ongoing_requests_one_takes_each_next_request(
    start: Any,
) -> None:
    """With ``max_ongoing_requests: 1``, a caller that sends its next request as soon as the
    last answer (written by the worker thread) arrives is never refused: the replica takes in
    the answers its workers wrote before it refuses anything at capacity."""
    replica: ReplicaProcess = start(
        CONVENTIONS + "sync_answers", "SyncAnswers", max_ongoing_requests=1
    )
    sock = authenticated(replica.port, channel.Role.INGRESS, timeout=30)
    file = sock.makefile("rb")
    statuses = []
    try:
        for i in range(500):
            sock.sendall(b"GET /?n=%d HTTP/1.1\r\nHost: r\r\n\r\n" % i)
            status, _, body = _read_answers(file, 1)[0]
            statuses.append(status)
            assert body == b"text %d" % i
    finally:
        sock.close()
    assert statuses == [200] * 500


def test_a_plain_handlers_caller_leaving_mid_call_leaves_no_descriptor_behind(
    start: Any,
) -> None:
    """A worker thread writes a plain handler's answer to a descriptor of the connection's own,
    held while the call runs: callers that leave mid-call (connection closed) get no answer
    written anywhere else, the replica closes every such descriptor once the calls return, and
    serves on."""
    replica: ReplicaProcess = start(CONVENTIONS + "sync_answers", "SyncAnswers")
    assert replica.get("/?n=0")[2] == b"text 0"
    fds = Path(f"/proc/{replica.proc.pid}/fd")
    before = len(list(fds.iterdir()))
    leaving = [authenticated(replica.port, channel.Role.INGRESS) for _ in range(5)]
    for sock in leaving:
        sock.sendall(b"GET /?kind=sleep&n=0.5 HTTP/1.1\r\nHost: r\r\n\r\n")
    time.sleep(0.2)  # the calls have started
    for sock in leaving:
        sock.close()
    wait_for(lambda: replica.metric("kubeserve_replica_ongoing_requests") == 0, 10, 0.05)
    wait_for(lambda: len(list(fds.iterdir())) <= before, 10, 0.05)
    status, _, body = replica.get("/?n=9")
    assert (status, body) == (200, b"text 9")
