"""``http_options.ssl_*`` on ``kubeserve start``: the proxy serves HTTPS to real clients (curl,
``http.client``), requires client certificates given ``ssl_ca_certs``, picks up rotated files
without dropping connections, and bad files are a 400 at the field before any proxy starts."""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.common import wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve, slow_app
from support.tls_certs import Authority, Pair

PASSWORD = "correct horse"


def tls_options(ks: Kubeserve, pair: Pair, **more: Any) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": ks.proxy_port,
        "ssl_certfile": str(pair.cert),
        "ssl_keyfile": str(pair.key),
        **more,
    }


def curl(ks: Kubeserve, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", *args, f"https://127.0.0.1:{ks.proxy_port}/slow?s=0"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def client_context(ca: Path, cert: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    return context


def get(conn: http.client.HTTPSConnection) -> int:
    conn.request("GET", "/slow?s=0")
    response = conn.getresponse()
    response.read()
    return response.status


def test_bad_tls_files_are_a_400_at_the_field(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    good = ca.issue("server", password=PASSWORD.encode())
    other = ca.issue("other")
    expired = ca.issue("expired", expired=True)
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    with running_kubeserve(tmp_path / "state") as ks:
        cases = {
            "ssl_keyfile": {"ssl_keyfile": str(tmp_path / "missing.key")},
            "ssl_certfile": {"ssl_certfile": str(tmp_path / "garbage.pem")},
        }
        mismatched = {"ssl_keyfile": str(other.key), "ssl_keyfile_password": None}
        for field, change in cases.items():
            options = tls_options(ks, good, ssl_keyfile_password=PASSWORD, **change)
            status, body = ks.put([slow_app()], http_options=options)
            assert status == 400 and body["details"][0]["loc"] == ["http_options", field], body
        status, body = ks.put([slow_app()], http_options=tls_options(ks, good, **mismatched))
        assert status == 400, body
        assert body["details"][0]["loc"] == ["http_options", "ssl_keyfile"], body
        assert "is not the key of ssl_certfile" in body["details"][0]["msg"]
        for password in (None, "wrong"):
            options = tls_options(ks, good, ssl_keyfile_password=password)
            status, body = ks.put([slow_app()], http_options=options)
            assert status == 400, body
            assert body["details"][0]["loc"] == ["http_options", "ssl_keyfile_password"], body
        status, body = ks.put([slow_app()], http_options=tls_options(ks, expired))
        assert status == 400 and "expired on" in body["details"][0]["msg"], body
        assert body["details"][0]["loc"] == ["http_options", "ssl_certfile"], body
        options = tls_options(
            ks, good, ssl_keyfile_password=PASSWORD, ssl_ca_certs=str(tmp_path / "garbage.pem")
        )
        status, body = ks.put([slow_app()], http_options=options)
        assert status == 400, body
        assert body["details"][0]["loc"] == ["http_options", "ssl_ca_certs"], body
        assert ks.details()["proxies"] == {}  # nothing was stored, no proxy started


def test_https_with_rotation_that_keeps_connections(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    first = ca.issue("server", password=PASSWORD.encode())
    live = Pair(tmp_path / "live.crt", tmp_path / "live.key")
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    with running_kubeserve(tmp_path / "state") as ks:
        options = tls_options(ks, live, ssl_keyfile_password=PASSWORD)
        status, body = ks.put([slow_app()], http_options=options)
        assert status == 200, body
        ks.wait_app("slow")
        (proxy,) = ks.details()["proxies"].values()

        answer = curl(ks, "--cacert", str(ca.path))
        assert answer.returncode == 0 and answer.stdout.startswith("{"), answer
        assert curl(ks).returncode == 60  # curl's "peer certificate cannot be authenticated"
        with pytest.raises(http.client.RemoteDisconnected):
            plain = http.client.HTTPConnection("127.0.0.1", ks.proxy_port, timeout=10)
            plain.request("GET", "/slow?s=0")
            plain.getresponse()

        kept = http.client.HTTPSConnection(
            "127.0.0.1", ks.proxy_port, context=client_context(ca.path), timeout=10
        )
        assert get(kept) == 200

        # rotation: another CA's certificate replaces the files, as a renewal writes them
        new_ca = Authority(tmp_path / "new-ca", name="renewed CA")
        renewed = new_ca.issue("server")
        live.key.write_bytes(renewed.key.read_bytes())
        live.cert.write_bytes(renewed.cert.read_bytes())

        def new_cert_served() -> bool:
            return curl(ks, "--cacert", str(new_ca.path)).returncode == 0

        wait_for(new_cert_served, 15, what="new handshakes to get the renewed certificate")
        assert curl(ks, "--cacert", str(ca.path)).returncode == 60
        assert get(kept) == 200  # the connection made before the rotation goes on
        assert kept.sock is not None and kept.sock.getpeercert()["issuer"] == (
            (("commonName", "kubeserve test CA"),),
        )
        kept.close()
        (after,) = ks.details()["proxies"].values()
        assert after["worker_id"] == proxy["worker_id"]  # the same proxy process

        changed = tls_options(ks, first, ssl_keyfile_password=PASSWORD)
        status, body = ks.put([slow_app()], http_options=changed)
        assert status == 409 and "http_options.ssl_" in body["error"], body


def test_client_certificates_required_with_ssl_ca_certs(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("server")
    client = ca.issue("client", client=True)
    stranger = Authority(tmp_path / "stranger", name="stranger CA").issue("client", client=True)
    with running_kubeserve(tmp_path / "state") as ks:
        options = tls_options(ks, server, ssl_ca_certs=str(ca.path))
        status, body = ks.put([slow_app()], http_options=options)
        assert status == 200, body
        ks.wait_app("slow")  # the proxy is HEALTHY though its probe has no client certificate

        ok = curl(
            ks, "--cacert", str(ca.path), "--cert", str(client.cert), "--key", str(client.key)
        )
        assert ok.returncode == 0 and ok.stdout.startswith("{"), ok
        assert curl(ks, "--cacert", str(ca.path)).returncode != 0
        foreign = ("--cert", str(stranger.cert), "--key", str(stranger.key))
        assert curl(ks, "--cacert", str(ca.path), *foreign).returncode != 0

        conn = http.client.HTTPSConnection(
            "127.0.0.1", ks.proxy_port, context=client_context(ca.path, client), timeout=10
        )
        assert get(conn) == 200 and get(conn) == 200
        conn.close()
