"""The metrics port of proxy and replica pods: GET /metrics with the instance's token only."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from kubeserve.runtime.metrics import ProxyMetrics
from kubeserve.runtime.metrics_listener import MetricsListener, metrics_token
from support.common import free_port, run

SECRET = b"s" * 32


async def _get(port: int, head: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_metrics_need_the_token_derived_from_the_data_plane_secret() -> None:
    async def go() -> None:
        ProxyMetrics().record("GET", "/hello", "hello", "Hello", 200, 3.0)
        port = free_port()
        listener = MetricsListener(SECRET)
        await listener.start("127.0.0.1", port)
        try:
            token = metrics_token(SECRET).encode()
            assert token != SECRET.hex().encode() and len(token) == 64
            get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
            assert (await _get(port, get + b"\r\n"))[0] == 401
            wrong = b"Authorization: Bearer " + metrics_token(b"t" * 32).encode() + b"\r\n\r\n"
            assert (await _get(port, get + wrong))[0] == 403
            status, body = await _get(port, get + b"Authorization: Bearer " + token + b"\r\n\r\n")
            assert status == 200
            names = {f.name for f in text_string_to_metric_families(body.decode())}
            assert "ray_serve_num_http_requests" in names
            other = b"GET /-/healthz HTTP/1.1\r\nAuthorization: Bearer " + token + b"\r\n\r\n"
            assert (await _get(port, other))[0] == 404
            assert (await _get(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000))[0] == 431
        finally:
            await listener.close()

    run(go())
