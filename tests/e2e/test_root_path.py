"""``http_options.root_path``: kubeserve behind a reverse proxy that strips a prefix.

As in Ray (whose proxy hands uvicorn the root path): requests arrive without the prefix and
routes match without it, and an ASGI ingress sees the prefix before its route prefix in
``root_path`` and before the path in ``path``, so the URLs it makes (``url_for``, FastAPI's docs
page) carry it. The value is fixed while the serving layer runs, like host and port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

FASTAPI = {"name": "fastapi", "route_prefix": "/api", "import_path": "ray_fastapi_app:fastapi_app"}
STARLETTE = {"name": "starlette", "route_prefix": "/echo", "import_path": "ray_starlette_app:app"}


def mounted(ks: Kubeserve, root_path: str) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": ks.proxy_port, "root_path": root_path}


def test_an_asgi_ingress_sees_the_root_path_before_its_route(tmp_path: Path) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        status, body = ks.put([FASTAPI, STARLETTE], http_options=mounted(ks, "/serve"))
        assert status == 200, body
        ks.wait_app("fastapi")
        ks.wait_app("starlette")
        status, answer = http("GET", f"{ks.proxy}/api/state")
        assert status == 200, answer
        assert answer["root_path"] == "/serve/api"
        assert answer["url"].endswith("/serve/api/state"), answer
        status, page = http("GET", f"{ks.proxy}/api/docs")
        assert status == 200 and "/serve/api/openapi.json" in str(page)
        status, answer = http("GET", f"{ks.proxy}/api/items/3?q=x")
        assert (status, answer["item_id"]) == (200, 3), answer
        assert ks.details()["http_options"]["root_path"] == "/serve"
        # fixed while the serving layer runs
        status, body = ks.put([FASTAPI], http_options=mounted(ks, "/other"))
        assert status == 409 and "http_options.root_path" in str(body), body
        ks.shutdown()
        # after a shutdown, another value applies
        assert ks.put([FASTAPI], http_options=mounted(ks, "/other"))[0] == 200
        ks.wait_app("fastapi")
        status, answer = http("GET", f"{ks.proxy}/api/state")
        assert (status, answer["root_path"]) == (200, "/other/api"), answer
        ks.shutdown()


def test_a_route_prefix_change_reaches_the_asgi_root_path_without_a_restart(
    tmp_path: Path,
) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        assert ks.put([FASTAPI])[0] == 200
        ks.wait_app("fastapi")
        (pid,) = ks.replica_pids("fastapi", "MyFastAPIDeployment")
        assert http("GET", f"{ks.proxy}/api/state")[1]["root_path"] == "/api"
        assert ks.put([{**FASTAPI, "route_prefix": "/v2"}])[0] == 200

        def moved() -> dict[str, Any] | None:
            status, answer = http("GET", f"{ks.proxy}/v2/state")
            return answer if status == 200 and answer["root_path"] == "/v2" else None

        answer = wait_for(moved, 30, what="the new route, root_path following it")
        assert answer["url"].endswith("/v2/state"), answer
        assert ks.replica_pids("fastapi", "MyFastAPIDeployment") == [pid]  # no restart
        assert http("GET", f"{ks.proxy}/api/state")[0] == 404
        ks.shutdown()
