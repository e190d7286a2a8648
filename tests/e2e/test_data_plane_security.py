"""The data plane against hostile clients: a real ``kubeserve start``, its proxy and replicas.

An application routed at ``/`` (the default) must never let client traffic reach a replica's
internal endpoints, whatever the spelling of the path; and nothing but the instance's own processes
may talk to a replica's port at all.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import socket
from pathlib import Path

from support.common import http
from support.kubeserve_start import Kubeserve, PickleMarker, replica_port


def _raw(port: int, request: bytes) -> bytes:
    """Send ``request`` as is and read until the server closes (``Connection: close``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


def _post(path: bytes, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (
        path,
        len(body),
        body,
    )


def test_client_paths_never_reach_internal_endpoints(
    clean_kubeserve: Kubeserve, tmp_path: Path
) -> None:
    ks = clean_kubeserve
    app = {
        "name": "echo",
        "route_prefix": "/",
        "import_path": "ks_echo_app:app",
        "deployments": [{"name": "Echo", "num_replicas": 1, "user_config": {"greeting": "hi"}}],
    }
    assert ks.put([app])[0] == 200
    ks.wait_app("echo")
    marker = tmp_path / "executed"
    pickled = pickle.dumps(((PickleMarker(marker),), {}))
    spellings = [b"/%2D/call/add", b"/%2d/call/add", b"//-/call/add", b"/./-/call/add"]
    spellings += [b"/%2F-/call/add", b"/a/../-/call/add", b"/-/call/add"]
    for path in spellings:
        answer = _raw(ks.proxy_port, _post(path, pickled))
        status = answer.split(b" ", 2)[1] if answer else b""
        assert status in (b"200", b"404"), (path, answer[:200])
        assert not marker.exists(), path
    # A live user_config change behind the admin API's back, and the metrics: not reachable.
    hijack = json.dumps({"user_config": {"greeting": "hijacked"}}).encode()
    for path in (b"/%2D/reconfigure", b"//-/reconfigure"):
        _raw(ks.proxy_port, _post(path, hijack))
    assert http("GET", f"{ks.proxy}/str")[1] == "> hi"
    metrics = _raw(
        ks.proxy_port, b"GET /%2D/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert b"kubeserve_replica_ongoing_requests" not in metrics
    # The replica's own port does not talk to anyone without the instance's secret.
    (pid,) = ks.replica_pids("echo", "Echo")
    assert _raw(replica_port(pid), _post(b"/-/call/add", pickled)) == b""
    assert not marker.exists()
    assert ks.replica_request(pid, "GET", "/-/healthz")[0] == 200  # the controller's way in


def test_the_secret_file_and_discovery_are_private(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    secret = ks.state_dir / "data-plane.secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    # Discovery tells where every replica listens: only for signed requests of the data plane.
    status, _ = http("GET", f"{ks.api}/-/snapshot?version=-1&timeout=0")
    assert status == 403


def test_signed_discovery_requests_with_bad_parameters_are_400(clean_kubeserve: Kubeserve) -> None:
    import time

    from kubeserve.runtime import channel

    ks = clean_kubeserve
    secret = (ks.state_dir / "data-plane.secret").read_text().strip().encode()
    for query in ("version=-1&timeout=nan", "version=x&timeout=1", "version=-1&timeout=-5"):
        target = f"/-/snapshot?{query}"
        signature = channel.sign_request(secret, "GET", target, time.time())
        headers = {channel.SIGNATURE_HEADER: signature}
        assert http("GET", f"{ks.api}{target}", headers=headers)[0] == 400, query
    target = "/-/snapshot?version=-1&timeout=0"
    stale = channel.sign_request(secret, "GET", target, time.time() - 3600)
    assert http("GET", f"{ks.api}{target}", headers={channel.SIGNATURE_HEADER: stale})[0] == 403
    fresh = channel.sign_request(secret, "GET", target, time.time())
    assert http("GET", f"{ks.api}{target}", headers={channel.SIGNATURE_HEADER: fresh})[0] == 200
    # The same signed request again (a captured one, replayed within its minute): refused.
    replayed = http("GET", f"{ks.api}{target}", headers={channel.SIGNATURE_HEADER: fresh})
    assert replayed[0] == 403 and "already answered" in str(replayed[1]), replayed
