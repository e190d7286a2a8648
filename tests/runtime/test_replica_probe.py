"""The replica's unauthenticated probe listener: answers the kubelet from the replica's own checks.

In process for the listener itself (what a caller can and cannot make it do), then a real replica
process started as the operator renders it: ``kubeserve replica`` with a ``probe_port`` and the
metrics port in its environment.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kubeserve.runtime import channel
from kubeserve.runtime.kubernetes.contract import METRICS_PORT_ENV
from kubeserve.runtime.metrics_listener import metrics_token
from kubeserve.runtime.replica.probe import ProbeListener
from support.channel_front import SECRET
from support.common import free_port
from support.replica_process import replica_config, replica_env
from support.sealed_socket import sealed_socket

ROOT = Path(__file__).resolve().parents[2]


async def raw(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_the_listener_reports_the_last_check_and_never_runs_user_code() -> None:
    async def scenario() -> None:
        port = free_port()
        probe = ProbeListener()
        await probe.start("127.0.0.1", port)
        healthz = b"GET /-/healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        try:
            starting = await raw(port, healthz)
            assert status_of(starting) == 503 and starting.endswith(b"starting")
            runs = 0
            failing = False

            async def check() -> None:
                nonlocal runs
                runs += 1
                if failing:
                    raise RuntimeError("database password is hunter2")

            probe.watch(check, period_s=0.05, timeout_s=1)

            async def status_is(code: int) -> bool:
                return status_of(await raw(port, healthz)) == code

            await until(lambda: status_is(200))
            failing = True
            await until(lambda: status_is(503))
            answer = await raw(port, healthz)
            assert b"unhealthy" in answer and b"hunter2" not in answer  # the error stays in the log
            failing = False
            await until(lambda: status_is(200))

            # Other requests are 404 and run nothing; probing does not run the user's check.
            for payload in (
                b"POST /-/healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                b"GET /-/reconfigure HTTP/1.1\r\n\r\n",
                b"GET /-/call/__call__ HTTP/1.1\r\n\r\n",
                b"GET / HTTP/1.1\r\n\r\n",
                b"\x16\x03\x01 not http at all\r\n",
            ):
                assert status_of(await raw(port, payload)) == 404, payload
            assert status_of(await raw(port, b"GET /-/healthz" + b"x" * 10_000)) == 431
            probe.drain()
            before = runs
            for _ in range(20):
                assert status_of(await raw(port, healthz)) == 503
            assert runs <= before + 1  # at most the check that was already running
        finally:
            await probe.close()

    asyncio.run(scenario())


def test_a_slow_check_counts_as_failed_after_its_timeout() -> None:
    async def scenario() -> None:
        port = free_port()
        probe = ProbeListener()
        await probe.start("127.0.0.1", port)

        async def hang() -> None:
            await asyncio.sleep(60)

        try:
            probe.watch(hang, period_s=0.05, timeout_s=0.1)
            await asyncio.sleep(0.3)  # several timeouts: the check never passes
            answer = await raw(port, b"GET /-/healthz HTTP/1.0\r\n\r\n")
            assert status_of(answer) == 503 and answer.endswith(b"unhealthy")
        finally:
            await probe.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- a replica process


class PodReplica(NamedTuple):
    port: int
    probe_port: int
    metrics_port: int
    proc: subprocess.Popen[bytes]


@pytest.fixture
def replica() -> Iterator[PodReplica]:
    """A replica started by the pod's command, ``kubeserve replica`` (outside a cluster)."""
    port, probe_port, metrics_port = free_port(), free_port(), free_port()
    config = replica_config(
        "ks_echo_app:app",
        "Echo",
        user_config={"greeting": "hi"},
        probe_port=probe_port,
        health_check_period_s=0.1,
        health_check_timeout_s=2.0,
    )
    env = replica_env(config)
    env[METRICS_PORT_ENV] = str(metrics_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubeserve.cli", "replica", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield PodReplica(port, probe_port, metrics_port, proc)
    finally:
        proc.kill()
        proc.wait(10)


def probe_status(port: int) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/-/healthz")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def wait_status(port: int, status: int) -> None:
    deadline = time.monotonic() + 30
    while probe_status(port) != status:
        assert time.monotonic() < deadline, f"probe never answered {status}"
        time.sleep(0.05)


def test_a_replica_process_reports_its_health_on_the_probe_port(replica: PodReplica) -> None:
    port, probe_port, _, proc = replica
    wait_status(probe_port, 200)  # constructed and listening

    # /sick through a real INGRESS connection makes the user's check_health fail from now on
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.sock = sealed_socket(port, channel.Role.INGRESS, SECRET, "r-1", 5)  # type: ignore[assignment]
    conn.request("GET", "/sick")
    assert conn.getresponse().status == 200
    conn.close()
    wait_status(probe_port, 503)

    # The replica port itself still refuses a plain HTTP request (no handshake).
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        plain.sendall(b"GET /-/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = plain.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/")
    proc.terminate()
    assert proc.wait(15) == 0


def test_a_replica_process_serves_metrics_on_the_port_the_operator_gave_it(
    replica: PodReplica,
) -> None:
    """``kubeserve replica`` reads the metrics port from the pod's environment and hands it to
    the replica, whose metrics listener answers with the instance's metrics token only."""
    wait_status(replica.probe_port, 200)  # the metrics port opens before the user's code starts
    conn = http.client.HTTPConnection("127.0.0.1", replica.metrics_port, timeout=5)
    try:
        conn.request(
            "GET", "/metrics", headers={"Authorization": f"Bearer {metrics_token(SECRET)}"}
        )
        response = conn.getresponse()
        assert response.status == 200
        assert b"ray_serve_replica_processing_queries" in response.read()
    finally:
        conn.close()
