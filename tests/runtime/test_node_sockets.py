"""A replica pod's node-local socket (``ServeInstance.spec.proxy.nodeLocalSockets``), with real
replica processes: the replica listens on ``<dir>/<its address>-<port>.sock`` beside its TCP port,
callers that have the directory reach it there (behind the same handshake), callers without it
and callers of a replica elsewhere use TCP, and a file left by a killed replica neither breaks
callers nor the next replica of that address.

The pod's address is played by ``127.0.0.2`` (a loopback address that is not the local
backend's, so the abstract-name shortcut of ``127.0.0.1`` does not apply)."""

from __future__ import annotations

import asyncio
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeserve.runtime import channel, local_socket, wire
from support.channel_front import SECRET
from support.common import free_port, wait_for
from support.replica_process import replica_config, replica_env

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "127.0.0.2"


def spawn(directory: Path, port: int) -> subprocess.Popen[bytes]:
    config = replica_config("ks_echo_app:app", "Echo", user_config={"greeting": "hello"})
    env = replica_env(config)
    env[local_socket.NODE_SOCKETS_ENV] = str(directory)
    env[local_socket.NODE_ADDRESS_ENV] = ADDRESS
    # bound to every address, as in a pod: the socket is named by the address callers know
    cmd = [sys.executable, "-m", "kubeserve.runtime.replica", "--host", "0.0.0.0"]
    return subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def call(port: int) -> tuple[bool, int, bytes]:
    """A ``CONTROL`` request for the health check through ``channel.open_socket`` as callers
    make it: (over a unix socket, status, body)."""

    async def run() -> tuple[bool, int, bytes]:
        sock, is_unix, _ = await channel.open_socket(
            ADDRESS, port, channel.Role.CONTROL, SECRET, "r-1", timeout_s=10
        )
        sock.close()
        status, body = await channel.request(
            ADDRESS, port, "GET", wire.HEALTHZ_PATH, SECRET, "r-1", timeout_s=10
        )
        return is_unix, status, body

    return asyncio.run(run())


@pytest.fixture
def directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The node's directory, which this test process (a caller on the node) has too."""
    monkeypatch.setenv(local_socket.NODE_SOCKETS_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def replicas() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start(directory: Path, port: int, started: list[subprocess.Popen[bytes]]) -> Path:
    proc = spawn(directory, port)
    started.append(proc)
    path = directory / f"{ADDRESS}-{port}.sock"

    def serving() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        try:
            return call(port)[1] == 200
        except OSError:
            return False

    wait_for(serving, 30, what="the replica to serve")
    return path


def test_callers_on_the_node_use_the_socket_others_tcp(
    directory: Path, replicas: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    path = start(directory, port, replicas)
    mode = path.lstat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert call(port)[:2] == (True, 200)
    # a caller without the directory (another node's) reaches the same replica over TCP
    monkeypatch.delenv(local_socket.NODE_SOCKETS_ENV)
    assert call(port)[:2] == (False, 200)
    # SIGTERM: the replica removes its file on the way out
    replicas[0].send_signal(signal.SIGTERM)
    assert replicas[0].wait(timeout=30) == 0
    assert not path.exists()


def test_a_killed_replicas_file_is_refused_then_replaced(
    directory: Path, replicas: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    path = start(directory, port, replicas)
    replicas[0].kill()
    replicas[0].wait()
    assert path.exists()  # SIGKILL: nobody removed it
    # a stale file: the caller is told to use TCP (where nobody listens either, for now)
    assert local_socket.connect_socket(ADDRESS, port) is None
    # the next replica of that address takes the name over and serves on it
    start(directory, port, replicas)
    assert call(port)[:2] == (True, 200)


def test_a_replica_elsewhere_has_no_file_here(directory: Path) -> None:
    """A replica on another node: no file in this node's directory, TCP at once."""
    assert local_socket.socket_name("10.244.1.7", 8000) == f"{directory}/10.244.1.7-8000.sock"
    assert local_socket.connect_socket("10.244.1.7", 8000) is None
