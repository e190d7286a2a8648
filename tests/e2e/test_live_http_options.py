"""``http_options`` timeouts changed on a running serving layer apply at once, to the running proxy
(it reads them from its discovery snapshot: no restart, no request lost)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve, slow_app


def proxy_pid(ks: Kubeserve) -> str:
    (proxy,) = ks.details()["proxies"].values()
    return str(proxy["worker_id"])  # the proxy process id


def idle_close_s(ks: Kubeserve) -> float:
    """How long the proxy keeps an idle keep-alive connection open after a response."""
    with socket.create_connection(("127.0.0.1", ks.proxy_port), timeout=30) as sock:
        sock.sendall(b"GET /slow?s=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        answered = time.monotonic()
        assert sock.recv(65536) == b""  # closed by the proxy (a timeout raises)
        return time.monotonic() - answered


def test_request_and_keep_alive_timeouts_apply_to_the_running_proxy(tmp_path: Path) -> None:
    with running_kubeserve(tmp_path) as ks:
        status, body = ks.put([slow_app()])
        assert status == 200, body
        ks.wait_app("slow")
        pid = proxy_pid(ks)
        assert http("GET", f"{ks.proxy}/slow?s=1.5")[0] == 200  # no request timeout yet

        options = {"host": "127.0.0.1", "port": ks.proxy_port}
        timeouts = {"request_timeout_s": 0.5, "keep_alive_timeout_s": 2}
        status, body = ks.put([slow_app()], http_options={**options, **timeouts})
        assert status == 200, body
        shown = ks.details()["http_options"]
        assert {k: shown[k] for k in timeouts} == timeouts

        def timed_out() -> bool:
            return http("GET", f"{ks.proxy}/slow?s=1.5")[0] == 504

        wait_for(timed_out, 10, what="the new request timeout to apply")
        started = time.monotonic()
        assert http("GET", f"{ks.proxy}/slow?s=3")[0] == 504
        assert time.monotonic() - started < 1.5
        assert http("GET", f"{ks.proxy}/slow?s=0.1")[0] == 200
        assert 1.5 < idle_close_s(ks) < 5  # the new keep-alive timeout, not the 90 s default
        assert proxy_pid(ks) == pid  # applied live: the same proxy process
