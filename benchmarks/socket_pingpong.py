"""What a request/answer round trip costs the kernel on this machine, by path, apart from kubeserve.

    sudo .venv/bin/python benchmarks/socket_pingpong.py [--round-trips N]

One client sends 200 bytes and waits for them back, N times, to an echo server in another
process over: a unix socket pair (what ``kubeserve start`` uses between its proxy and a replica),
loopback TCP, and TCP between two network namespaces joined by veths and a bridge (what a pod
network without node-local sockets does). Prints the client's wall and system time per round
trip. The namespaces and the bridge (``ksppa``, ``ksppb``, ``ksppbr``) are removed at the end.
Needs root (``ip netns``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

MESSAGE = b"x" * 200
SERVER = "10.250.0.2"


def echo(sock: socket.socket) -> None:
    while data := sock.recv(4096):
        sock.send(data)


def client(sock: socket.socket, round_trips: int) -> tuple[float, float]:
    """(wall, system) microseconds per round trip."""
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(round_trips):
        sock.send(MESSAGE)
        sock.recv(4096)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return wall / round_trips * 1e6, (after.ru_stime - before.ru_stime) / round_trips * 1e6


def unix_pair(round_trips: int) -> tuple[float, float]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        ours.close()
        echo(theirs)
        os._exit(0)
    theirs.close()
    try:
        return client(ours, round_trips)
    finally:
        ours.close()
        os.waitpid(pid, 0)


def tcp(round_trips: int, host: str, netns: str | None = None) -> tuple[float, float]:
    """Over TCP to an echo server on ``host`` (in namespace ``netns``, run by ``ip netns exec``)
    from this process (in namespace ``ksppa`` when ``netns`` is given)."""
    program = (
        "import socket,sys\n"
        "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        f"s.bind(({host!r},0));s.listen();print(s.getsockname()[1],flush=True)\n"
        "c,_=s.accept();c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
        "while d:=c.recv(4096): c.send(d)\n"
    )
    prefix = ["ip", "netns", "exec", netns] if netns else []
    server = subprocess.Popen([*prefix, sys.executable, "-c", program], stdout=subprocess.PIPE)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    try:
        if netns:  # the client in the other namespace: a child that reports its figures
            code = (
                "import socket,sys\n"
                f"sys.path.insert(0,{os.path.dirname(os.path.abspath(__file__))!r})\n"
                "from socket_pingpong import client\n"
                f"s=socket.create_connection(({host!r},{port}))\n"
                "s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
                f"print(*client(s,{round_trips}))\n"
            )
            out = subprocess.run(
                ["ip", "netns", "exec", "ksppa", sys.executable, "-c", code],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            wall, system = (float(x) for x in out.split())
            return wall, system
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return client(sock, round_trips)
        finally:
            sock.close()
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def bridged_namespaces() -> Iterator[None]:
    """Namespaces ``ksppa`` (10.250.0.1) and ``ksppb`` (10.250.0.2) on bridge ``ksppbr``."""

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True)

    try:
        ip("link", "add", "ksppbr", "type", "bridge")
        ip("link", "set", "ksppbr", "up")
        for side, address in (("a", "10.250.0.1/24"), ("b", "10.250.0.2/24")):
            ip("netns", "add", f"kspp{side}")
            ip("link", "add", f"kspp{side}h", "type", "veth", "peer", "name", f"kspp{side}c")
            ip("link", "set", f"kspp{side}c", "netns", f"kspp{side}")
            ip("link", "set", f"kspp{side}h", "master", "ksppbr", "up")
            ip("-n", f"kspp{side}", "addr", "add", address, "dev", f"kspp{side}c")
            ip("-n", f"kspp{side}", "link", "set", f"kspp{side}c", "up")
            ip("-n", f"kspp{side}", "link", "set", "lo", "up")
        yield
    finally:
        for args in (("netns", "del", "ksppa"), ("netns", "del", "ksppb"),
                     ("link", "del", "ksppbr")):  # fmt: skip
            subprocess.run(["ip", *args], capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=100_000)
    n = parser.parse_args().round_trips
    rows = [("unix socket pair", unix_pair(n)), ("loopback TCP", tcp(n, "127.0.0.1"))]
    with bridged_namespaces():
        rows.append(("TCP across veths and a bridge", tcp(n, SERVER, "ksppb")))
    print(f"{'path':<32} {'us/round trip':>14} {'client system us':>17}")
    for name, (wall, system) in rows:
        print(f"{name:<32} {wall:>14.1f} {system:>17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
