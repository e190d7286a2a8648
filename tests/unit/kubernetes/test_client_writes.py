"""The operator's API client bounds its writes in flight (the other controllers and kubectl wait
behind whatever it queues at the API server); its reads are not held back. Against a real HTTP
server standing in for the API server, which holds every request a moment."""

from __future__ import annotations

import asyncio

from aiohttp import web
from kubernetes_asyncio import client

from kubeserve.runtime.kubernetes.client import Kube


async def _scenario() -> tuple[int, int]:
    in_flight = {"PATCH": 0, "GET": 0}
    peak = {"PATCH": 0, "GET": 0}

    async def handle(request: web.Request) -> web.Response:
        in_flight[request.method] += 1
        peak[request.method] = max(peak[request.method], in_flight[request.method])
        await asyncio.sleep(0.05)
        in_flight[request.method] -= 1
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "x"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    kube = Kube(client.ApiClient(configuration))
    kube.limit_writes(4)
    fenced = kube.fenced(lambda: True)  # shares the bound
    try:
        await asyncio.gather(
            *(
                (kube if i % 2 else fenced).merge_patch("ConfigMap", "ns", f"c{i}", {"data": {}})
                for i in range(24)
            ),
            *(kube.get("ConfigMap", "ns", f"c{i}") for i in range(12)),
        )
    finally:
        await kube.close()
        await runner.cleanup()
    return peak["PATCH"], peak["GET"]


def test_writes_in_flight_are_bounded_and_reads_are_not() -> None:
    writes, reads = asyncio.run(_scenario())
    assert writes == 4
    assert reads > 4
