"""``kubeserve start --data-path native`` with ``http_options.ssl_*``: the native process
terminates TLS on the proxy port (an encrypted key, decrypted by the proxy with
``ssl_keyfile_password``), bad files are still a 400 at the field, and rotated files reach new
handshakes while a kept connection goes on; a WebSocket over TLS (handed off, decrypted, to the
Python proxy) echoes."""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess
from pathlib import Path

import aiohttp

from e2e.test_local_tls import PASSWORD, client_context, get, tls_options
from e2e.test_native_data_path import native_pid, proxy_pid
from support.common import run, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve, slow_app
from support.tls_certs import Authority, Pair


def curl(ks: Kubeserve, ca: Path) -> subprocess.CompletedProcess[str]:
    url = f"https://127.0.0.1:{ks.proxy_port}/slow?s=0"
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", "--cacert", str(ca), url],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def websocket_echo(ks: Kubeserve, context: ssl.SSLContext) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"wss://127.0.0.1:{ks.proxy_port}/ws/", ssl=context) as ws,
    ):
        await ws.send_str("hello over wss")
        return await ws.receive_str(timeout=10)


def test_https_through_the_native_data_path_with_rotation(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    first = ca.issue("server", password=PASSWORD.encode())
    live = Pair(tmp_path / "live.crt", tmp_path / "live.key")
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    with running_kubeserve(tmp_path / "state", args=("--data-path", "native")) as ks:
        wrong = tls_options(ks, live, ssl_keyfile_password="wrong")
        status, body = ks.put([slow_app()], http_options=wrong)
        assert status == 400, body
        assert body["details"][0]["loc"] == ["http_options", "ssl_keyfile_password"], body

        echo = {"name": "echo", "route_prefix": "/ws", "import_path": "ray_websocket_app:echo_app"}
        status, body = ks.put(
            [slow_app(), echo], http_options=tls_options(ks, live, ssl_keyfile_password=PASSWORD)
        )
        assert status == 200, body
        ks.wait_app("slow")
        ks.wait_app("echo")
        proxy = proxy_pid(ks)
        assert native_pid(proxy) is not None, "the proxy serving TLS runs no kubeserve-fastpath"
        answer = curl(ks, ca.path)
        assert answer.returncode == 0 and answer.stdout.startswith("{"), answer

        assert run(websocket_echo(ks, client_context(ca.path))) == "hello over wss"

        kept = http.client.HTTPSConnection(
            "127.0.0.1", ks.proxy_port, context=client_context(ca.path), timeout=10
        )
        assert get(kept) == 200
        new_ca = Authority(tmp_path / "new-ca", name="renewed CA")
        renewed = new_ca.issue("server")
        live.key.write_bytes(renewed.key.read_bytes())
        live.cert.write_bytes(renewed.cert.read_bytes())
        wait_for(
            lambda: curl(ks, new_ca.path).returncode == 0,
            15,
            what="new handshakes to get the renewed certificate",
        )
        assert curl(ks, ca.path).returncode == 60  # the old CA does not verify it
        assert get(kept) == 200 and get(kept) == 200  # the connection made before goes on
        kept.close()
        assert proxy_pid(ks) == proxy  # the same proxy process
