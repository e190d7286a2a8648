"""The native data path serving HTTPS: ``kubeserve-fastpath --tls`` in front of a real Python proxy
(:class:`~kubeserve.runtime.proxy.ProxyServer` with ``tls`` and ``native``), real replicas, real TLS
clients (Python's ``ssl``, curl).

What a user notices: keep-alive HTTPS answered natively with an encrypted key decrypted by the
proxy; client certificates required given ``ssl_ca_certs``; rotated files reach new handshakes
while a keep-alive connection made before goes on; what the native path hands off over TLS is
answered exactly as a Python proxy serving TLS answers it.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from kubeserve.runtime.proxy import ProxyServer
from kubeserve.runtime.tls import TLSFiles
from runtime.test_fastpath import Conn, Echo, _endpoint, _snapshot, get, replica
from support.channel_front import SECRET
from support.common import run, wait_until
from support.static_source import StaticSource
from support.tls_certs import Authority, Pair

PASSWORD = "correct horse"


def client_context(ca: Path, cert: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    return context


async def tls_conn(port: int, context: ssl.SSLContext) -> Conn:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    return Conn(reader, writer)


async def presented(port: int, ca: Path) -> bytes:
    """The certificate a new handshake presents (verified against ``ca``), or b"" on failure."""
    try:
        conn = await tls_conn(port, client_context(ca))
    except (ssl.SSLError, OSError):
        return b""
    ssl_object = conn.writer.get_extra_info("ssl_object")
    der: bytes = ssl_object.getpeercert(binary_form=True)
    conn.close()
    return der


def der(pair: Pair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


class TlsFront:
    """One replica of ``app#D`` on ``/api`` behind a proxy serving ``files``, natively or not."""

    def __init__(self, files: TLSFiles, *, native: bool = True, expect_native: bool = True) -> None:
        self.files = files
        self.native = native
        self.expect_native = native and expect_native
        self.app = Echo("a")
        self.server: asyncio.Server | None = None
        self.proxy: ProxyServer | None = None

    async def __aenter__(self) -> ProxyServer:
        self.server, port = await replica(self.app, "replica-a")
        snapshot = _snapshot("/api", "D", [_endpoint("replica-a", port)])
        self.proxy = ProxyServer(
            "127.0.0.1",
            0,
            secret=SECRET,
            source=StaticSource(snapshot),
            tls=self.files,
            native=self.native,
        )
        await self.proxy.start()
        if self.expect_native:
            assert self.proxy.native is not None, "the native process does not serve"
            await wait_until(lambda: self.proxy is not None and self.proxy.native_version == 1)
        return self.proxy

    async def __aexit__(self, *_: object) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        if self.server is not None:
            self.server.close()


def test_https_keep_alive_is_answered_natively_with_an_encrypted_key(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("server", password=PASSWORD.encode())

    async def go() -> None:
        async with TlsFront(TLSFiles(str(server.cert), str(server.key), PASSWORD)) as proxy:
            assert proxy.native is not None and proxy.native.tls
            conn = await tls_conn(proxy.port, client_context(ca.path))
            for _ in range(5):
                status, headers, body = await conn.request(get("/api/x"))
                assert status == 200 and body == b"GET" and headers["x-replica"] == "a"
            status, _, _ = await conn.request(get("/-/healthz"))  # the Python proxy's, handed off
            assert status == 200
            conn.close()
            # Connection: close (a client making a connection per request): answered natively,
            # then the connection ends (close_notify, then the socket)
            conn = await tls_conn(proxy.port, client_context(ca.path))
            status, headers, _ = await conn.request(get("/api/once", "Connection: close\r\n"))
            assert status == 200 and headers["connection"] == "close"
            assert await asyncio.wait_for(conn.reader.read(), 10) == b""
            conn.close()
            stats = await proxy.native.stats()
            assert stats["answered"] == {"app#D": {"200": 6}} and stats["handed_off"] == 1
            assert stats["tls_installs"] == 1
            # curl, a real client of its own: verifies the certificate, gets the answer
            curl = await asyncio.to_thread(
                subprocess.run,
                ["curl", "-sS", "--max-time", "10", "--cacert", str(ca.path),
                 f"https://localhost:{proxy.port}/api/c"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert curl.returncode == 0 and curl.stdout == "GET", curl
            # plain HTTP on the HTTPS port: no answer, the connection closes (as the Python proxy)
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(get("/api/x"))
            assert not (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/")
            writer.close()

    run(go())


def test_client_certificates_are_required_given_ssl_ca_certs(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("server")
    client = ca.issue("client", client=True)
    stranger = Authority(tmp_path / "stranger", name="stranger CA").issue("client", client=True)

    async def go() -> None:
        files = TLSFiles(str(server.cert), str(server.key), None, str(ca.path))
        async with TlsFront(files) as proxy:
            conn = await tls_conn(proxy.port, client_context(ca.path, client))
            for _ in range(3):
                assert (await conn.request(get("/api/x")))[0] == 200
            conn.close()
            for who in (None, stranger):
                refused = False
                try:  # TLS 1.3: the refusal may come after the client's handshake completed
                    conn = await tls_conn(proxy.port, client_context(ca.path, who))
                    conn.writer.write(get("/api/x"))
                    refused = await asyncio.wait_for(conn.reader.read(), 10) == b""
                except (ssl.SSLError, ConnectionError):
                    refused = True
                assert refused, f"a client with {who} was served"
            assert proxy.native is not None
            assert (await proxy.native.stats())["answered"] == {"app#D": {"200": 3}}

    run(go())


def test_rotated_files_reach_new_handshakes_and_a_kept_connection_goes_on(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    first = ca.issue("server", password=PASSWORD.encode())
    live = Pair(tmp_path / "live.crt", tmp_path / "live.key")
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)

    async def go() -> None:
        async with TlsFront(TLSFiles(str(live.cert), str(live.key), PASSWORD)) as proxy:
            assert proxy.native is not None and proxy.tls_context is not None
            kept = await tls_conn(proxy.port, client_context(ca.path))
            assert (await kept.request(get("/api/x")))[0] == 200
            assert await presented(proxy.port, ca.path) == der(first)
            # a renewal from another CA, written over the files (the key not encrypted now)
            new_ca = Authority(tmp_path / "new-ca", name="renewed CA")
            renewed = new_ca.issue("server")
            live.key.write_bytes(renewed.key.read_bytes())
            live.cert.write_bytes(renewed.cert.read_bytes())
            proxy.tls_context.reload_if_changed()  # (the poll would, within 2 s)

            async def renewed_served() -> bool:
                return await presented(proxy.port, new_ca.path) == der(renewed)

            await wait_until(renewed_served, 10)
            assert await presented(proxy.port, ca.path) == b""  # the old CA no longer verifies
            for _ in range(3):  # the connection made before the rotation goes on, natively
                status, _, body = await kept.request(get("/api/x"))
                assert status == 200 and body == b"GET"
            kept.close()
            stats = await proxy.native.stats()
            assert stats["tls_installs"] == 2 and stats["answered"] == {"app#D": {"200": 4}}
            assert stats["handed_off"] == 0

    run(go())


def _requests() -> list[bytes]:
    """Requests the native path hands off (a chunked body, an unknown route, a proxy endpoint, a
    body above 64 KiB), then one with ``Connection: close`` it answers itself."""
    chunked = (
        b"POST /api/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    return [
        chunked,
        get("/nowhere"),
        get("/-/routes"),
        b"POST /api/big HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"b" * 100_000,
        get("/api/last", "Connection: close\r\n"),
    ]


def test_a_request_handed_off_over_tls_is_answered_as_by_the_python_proxy(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("server", password=PASSWORD.encode())
    files = TLSFiles(str(server.cert), str(server.key), PASSWORD)

    async def answers(native: bool) -> list[tuple[int, dict[str, Any], bytes]]:
        out = []
        async with TlsFront(files, native=native) as proxy:
            for raw in _requests():
                conn = await tls_conn(proxy.port, client_context(ca.path))
                status, headers, body = await conn.request(raw)
                conn.close()
                headers.pop("x-request-id", None)
                headers.pop("date", None)
                out.append((status, headers, body))
            if native:
                assert proxy.native is not None
                stats = await proxy.native.stats()
                assert stats["handed_off"] == 4 and stats["answered"] == {"app#D": {"200": 1}}
        return out

    async def go() -> None:
        python, native = await answers(False), await answers(True)
        assert [a[0] for a in native] == [200, 404, 200, 200, 200]
        assert native[-1][1]["connection"] == "close"
        assert native == python

    run(go())


def test_a_key_the_native_path_cannot_sign_with_leaves_the_proxy_on_the_python_path(
    tmp_path: Path,
) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("server", curve=ec.SECP521R1())  # OpenSSL signs with P-521, ring does not

    async def go() -> None:
        async with TlsFront(
            TLSFiles(str(server.cert), str(server.key)), expect_native=False
        ) as proxy:
            assert proxy.native is None  # (logged) the Python proxy serves HTTPS itself
            conn = await tls_conn(proxy.port, client_context(ca.path))
            assert (await conn.request(get("/api/x")))[0] == 200
            conn.close()

    run(go())
