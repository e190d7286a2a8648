"""Ray Serve applications written as Ray's documentation writes them, deployed unchanged on
Kubernetes with the real Ray 2.60 ``serve deploy`` against the operator's admin API, and answering
through the proxy pod as they would on Ray: FastAPI ingress (routes, validation, docs and
``docs_path``, streaming), model composition with a streaming handle, batching, multiplexing and
application builders with ``args``, WebSockets. The replicas are pods of the tests' image, with
no Ray in it.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from support import ray_cli
from support.common import run, streamed_lines
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import SMALL_RAY_REPLICA, AdminApi, OperatorProcess, config, proxy_url
from support.ray_cli import needs_ray_serve

pytestmark = needs_ray_serve


def _small(*deployments: str) -> list[dict[str, Any]]:
    """Overrides that let every replica pod fit the node's two cores."""
    return [{"name": name, **SMALL_RAY_REPLICA} for name in deployments]


APPLICATIONS: list[dict[str, Any]] = [
    {
        "name": "fastapi",
        "route_prefix": "/api",
        "import_path": "ray_fastapi_app:fastapi_app",
        "deployments": _small("MyFastAPIDeployment"),
    },
    {
        "name": "compose",
        "route_prefix": "/compose",
        "import_path": "ray_composition_app:app",
        "deployments": _small("Ingress", "Adder", "Multiplier", "Streamer"),
    },
    {
        "name": "batch",
        "route_prefix": "/batch",
        "import_path": "ray_batching_app:app",
        "deployments": _small("BatchedModel"),
    },
    {
        "name": "mux-router",
        "route_prefix": "/route-model",
        "import_path": "ray_multiplex_app:router_app",
        "deployments": _small("Router", "ModelInferencer"),
    },
    {
        "name": "websocket",
        "route_prefix": "/ws",
        "import_path": "ray_websocket_app:echo_app",
        "deployments": _small("EchoServer"),
    },
    {
        "name": "builder",
        "route_prefix": "/built",
        "import_path": "ray_builder_app:app_builder",
        "args": {"message": "from args"},
        "deployments": _small("HelloWorld"),
    },
]


class Proxy:
    """Requests to the instance's proxy pod."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = str(parts.hostname), int(parts.port or 80)

    def fetch(
        self, path: str, method: str = "GET", body: bytes | None = None, **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(
        self, path: str, method: str = "GET", body: bytes | None = None, **headers: str
    ) -> Any:
        status, _, raw = self.fetch(path, method, body, **headers)
        return status, json.loads(raw)


def test_ray_example_apps_deployed_with_the_ray_cli_answer_through_the_proxy_pod(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    api = AdminApi(operator)
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config(APPLICATIONS)))
    api.use_tests_image()
    ray_cli.serve(api.url, "deploy", str(path), token=api.token)
    details = api.wait_running(*(a["name"] for a in APPLICATIONS), timeout_s=200)
    apps = details["applications"]
    assert apps["fastapi"]["docs_path"] == "/docs"
    assert apps["compose"]["docs_path"] is None
    proxy = Proxy(proxy_url(control_plane, namespace))

    # FastAPI: routes, path and query parameters, middleware, validation, HTTPException, docs.
    assert proxy.json("/api/") == (200, "Hello, world!")
    assert proxy.json("/api/items/42?q=blue") == (200, {"kind": "item", "item_id": 42, "q": "blue"})
    status, answer = proxy.json("/api/items/not-a-number")
    assert status == 422 and answer["detail"][0]["loc"] == ["path", "item_id"]
    item = json.dumps({"name": "pen", "price": 1.5}).encode()
    created = proxy.json("/api/items", "POST", item, **{"Content-Type": "application/json"})
    assert created == (200, {"name": "pen", "price": 1.5})
    assert proxy.json("/api/missing") == (404, {"detail": "no such thing"})
    status, answer = proxy.json("/api/state")
    assert (status, answer["root_path"]) == (200, "/api")
    assert answer["greeting"] == "hello from lifespan"
    status, document = proxy.json("/api/openapi.json")
    assert status == 200 and "/items/{item_id}" in document["paths"]
    status, _, page = proxy.fetch("/api/docs")
    assert status == 200 and b"/api/openapi.json" in page

    # A StreamingResponse arrives chunk by chunk through the proxy pod.
    streamed = streamed_lines(proxy.host, proxy.port, "/api/stream")
    assert (streamed.status, streamed.first, streamed.rest) == (200, b"0\n", b"1\n2\n")
    assert streamed.first_at < streamed.total - 0.5, streamed

    # Composition across replica pods, and a streaming handle.
    assert proxy.json("/compose?input=5") == (200, {"result": 12})
    assert proxy.fetch("/compose/stream?n=4")[::2] == (200, b"0\n1\n2\n3\n")

    # Batching groups concurrent requests.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: proxy.json(f"/batch?x={x}")[1], range(8)))
    assert [a["output"] for a in answers] == [x * 2 for x in range(8)]
    assert max(a["batch_size"] for a in answers) > 1

    # Multiplexing through a handle's multiplexed_model_id.
    assert proxy.json("/route-model?model=m7") == (200, {"prediction": "m7:y", "loads": 1})

    # WebSockets through the proxy pod: an echo, and a path parameter with the server's close.
    async def websocket() -> None:
        base = f"ws://{proxy.host}:{proxy.port}/ws"
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{base}/") as ws:
                await ws.send_str("hello")
                assert await ws.receive_str(timeout=30) == "hello"
            async with session.ws_connect(f"{base}/items/7?q=seven") as ws:
                answer = await ws.receive_json(timeout=30)
                assert (answer["item_id"], answer["root_path"]) == (7, "/ws")
                assert (await ws.receive(timeout=30)).type == aiohttp.WSMsgType.CLOSE
                assert ws.close_code == 4007

    run(websocket())

    # A builder's args.
    status, answer = proxy.json("/built")
    assert (status, answer["message"], answer["app"]) == (200, "from args", "builder")

    status_text = ray_cli.serve(api.url, "status", token=api.token)
    statuses = yaml.safe_load(status_text)["applications"]
    assert {name: s["status"] for name, s in statuses.items()} == {
        a["name"]: "RUNNING" for a in APPLICATIONS
    }
