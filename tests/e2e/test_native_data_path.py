"""``kubeserve start --data-path native``: the proxy serves through ``kubeserve-fastpath`` (the
experimental native data path, ``make native``), a real instance end to end."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from kubeserve.runtime.fastpath import find_binary
from support.common import http, pid_alive, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve, slow_app


def proxy_pid(ks: Kubeserve) -> int:
    (proxy,) = ks.details()["proxies"].values()
    return int(proxy["worker_id"])


def native_pid(proxy: int) -> int | None:
    """The proxy's kubeserve-fastpath child, if it runs one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == proxy and exe.endswith("kubeserve-fastpath"):
            return int(entry.name)
    return None


def keep_alive_gets(port: int, path: str, count: int) -> list[bytes]:
    """``count`` GETs of ``path`` on one connection; the answers' heads."""
    heads = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for _ in range(count):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += reader.readline()
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            reader.read(length)
            heads.append(head)
    return heads


def test_the_proxy_serves_through_the_native_data_path_and_survives_a_kill(tmp_path: Path) -> None:
    assert find_binary() is not None, "`make native` builds kubeserve-fastpath (`make test` does)"
    with running_kubeserve(tmp_path, args=("--data-path", "native")) as ks:
        status, body = ks.put([slow_app()])
        assert status == 200, body
        ks.wait_app("slow")
        proxy = proxy_pid(ks)
        native = native_pid(proxy)
        assert native is not None, "the proxy runs no kubeserve-fastpath"
        heads = keep_alive_gets(ks.proxy_port, "/slow?s=0", 20)
        assert all(h.startswith(b"HTTP/1.1 200") and b"x-request-id: " in h for h in heads)
        ids = [h.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode() for h in heads]
        # the proxy's access lines (Ray's format) hold the requests the native path answered
        (details,) = ks.details()["proxies"].values()
        log = Path(details["log_file_path"])
        wait_for(
            lambda: all(f" {rid} -- GET /slow 200 " in log.read_text() for rid in ids),
            10,
            what="the proxy's access lines of the natively answered requests",
        )
        # the rare cases are the Python proxy's: its own endpoints, an unknown route
        assert http("GET", f"{ks.proxy}/-/routes")[1] == {"/slow": "slow"}
        assert http("GET", f"{ks.proxy}/nowhere")[0] == 404
        # kill -9 the proxy: its native child leaves with it, the next proxy serves again
        os.kill(proxy, signal.SIGKILL)
        wait_for(lambda: not pid_alive(native), 10, what="kubeserve-fastpath to exit")
        wait_for(lambda: proxy_pid(ks) != proxy, 30, what="a new proxy")
        wait_for(lambda: native_pid(proxy_pid(ks)) is not None, 30, what="its native process")
        wait_for(lambda: http("GET", f"{ks.proxy}/slow?s=0")[0] == 200, 30, what="serving again")
