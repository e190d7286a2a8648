"""An HTTP client that leaves before its answer's end cancels the request in the replica, as
Ray Serve does: the handler's task gets ``asyncio.CancelledError`` (its ``finally`` runs), the
handle calls it awaits are cancelled in their replicas, a streamed body stops, the proxy counts
the request 499, and the next requests are served. On both proxy data paths."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.metrics_scrape import scrape, value

APPS = [
    {"name": "cancel", "route_prefix": "/cancel", "import_path": "ks_cancel_app:app"},
    {"name": "asgi", "route_prefix": "/asgi", "import_path": "ks_cancel_app:asgi"},
]


@pytest.fixture(scope="module", params=["native", "python"])
def ks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kubeserve]:
    args = ("--data-path", request.param)
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-cancel"), args=args) as server:
        status, body = server.put(APPS)
        assert status == 200, body
        for app in APPS:
            server.wait_app(str(app["name"]), timeout_s=120)
        yield server


def tag_of(what: str) -> str:
    return f"{what}-{time.time_ns()}"


def send_and_leave_later(ks: Kubeserve, target: str, request_id: str = "") -> socket.socket:
    """A client that sends ``GET target`` and keeps its connection open (the caller closes it)."""
    sock = socket.create_connection(("127.0.0.1", ks.proxy_port), timeout=10)
    id_line = f"X-Request-Id: {request_id}\r\n".encode() if request_id else b""
    sock.sendall(b"GET %s HTTP/1.1\r\nHost: test\r\n%s\r\n" % (target.encode(), id_line))
    return sock


def access_line(path: str, request_id: str, access: str) -> bool:
    """Whether the log file at ``path`` has the access line ``access`` of ``request_id``."""
    return any(
        f" {request_id} -- {access} " in line for line in Path(path).read_text().splitlines()
    )


def state(ks: Kubeserve, path: str) -> dict[str, Any]:
    status, body = http("GET", f"{ks.proxy}{path}", timeout=10)
    assert status == 200, body
    assert isinstance(body, dict), body
    return body


def served_after(ks: Kubeserve) -> None:
    """The next requests are served, on one keep-alive connection and on new ones."""
    conn = HTTPConnection("127.0.0.1", ks.proxy_port, timeout=10)
    try:
        for _ in range(5):
            conn.request("GET", "/cancel")
            answer = conn.getresponse()
            assert (answer.status, answer.read()) == (200, b"ok")
    finally:
        conn.close()
    assert http("GET", f"{ks.proxy}/cancel", timeout=10) == (200, "ok")


def left_count(ks: Kubeserve, app: str) -> float:
    return value(
        scrape(ks), "ray_serve_num_http_requests_total", status_code="499", application=app
    )


def test_a_client_leaving_cancels_the_handler_and_its_handle_call(ks: Kubeserve) -> None:
    tag = tag_of("hold")
    before = left_count(ks, "cancel")
    sock = send_and_leave_later(ks, f"/cancel?hold={tag}", request_id=tag)
    wait_for(
        lambda: state(ks, f"/cancel?state={tag}") == {"front": ["running"], "back": ["running"]},
        20,
        what="the handler and its handle call running",
    )
    sock.close()
    ended = {
        "front": ["running", "cancelled", "finally"],
        "back": ["running", "cancelled", "finally"],
    }
    wait_for(
        lambda: state(ks, f"/cancel?state={tag}") == ended,
        10,
        what="the handler and its handle call cancelled",
    )
    wait_for(lambda: left_count(ks, "cancel") >= before + 1, 10, what="the request counted 499")
    # the access lines, as Ray writes them: 499 at the proxy, CANCELLED at the replica
    (proxy,) = ks.details()["proxies"].values()
    wait_for(
        lambda: access_line(proxy["log_file_path"], tag, "GET /cancel 499"),
        10,
        what="the proxy's access line",
    )
    (replica,) = ks.details()["applications"]["cancel"]["deployments"]["Front"]["replicas"]
    wait_for(
        lambda: access_line(replica["log_file_path"], tag, "GET /cancel CANCELLED"),
        10,
        what="the replica's access line",
    )
    errors = {"deployment": "Front", "exception_type": "CancelledError"}
    wait_for(
        lambda: value(scrape(ks), "ray_serve_deployment_error_counter_total", **errors) >= 1,
        10,
        what="the replica counting the CancelledError",
    )
    served_after(ks)


def test_a_client_leaving_a_stream_stops_it(ks: Kubeserve) -> None:
    tag = tag_of("stream")
    sock = send_and_leave_later(ks, f"/cancel?stream={tag}")
    received = b""
    while b"tick" not in received:  # the stream began
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    sock.close()
    wait_for(
        lambda: "finally" in state(ks, f"/cancel?state={tag}")["front"],
        10,
        what="the streaming generator stopped",
    )
    served_after(ks)


def test_a_client_leaving_cancels_an_asgi_endpoint(ks: Kubeserve) -> None:
    tag = tag_of("asgi")
    sock = send_and_leave_later(ks, f"/asgi/hold/{tag}")
    wait_for(
        lambda: state(ks, f"/asgi/state/{tag}") == {"front": ["running"]},
        20,
        what="the endpoint running",
    )
    sock.close()
    wait_for(
        lambda: state(ks, f"/asgi/state/{tag}") == {"front": ["running", "cancelled", "finally"]},
        10,
        what="the endpoint cancelled",
    )
    served_after(ks)


def test_a_request_pipelined_while_the_answer_is_awaited_is_served_in_turn(ks: Kubeserve) -> None:
    """The proxy watches the client while the replica works: a next request sent meanwhile on
    the same connection (pipelining) is kept, not taken for a disconnect, and answered after."""
    sock = send_and_leave_later(ks, "/cancel?sleep=0.5")
    try:
        time.sleep(0.2)
        sock.sendall(b"GET /cancel HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    finally:
        sock.close()
    first, _, second = received.partition(b"HTTP/1.1 200 OK")[2].partition(b"HTTP/1.1 200 OK")
    assert first.endswith(b"\r\n\r\nslept"), received
    assert second.endswith(b"\r\n\r\nok"), received
