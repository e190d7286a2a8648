"""The OpenAPI document describes every route the admin server has, and the server serves it."""

from __future__ import annotations

from aiohttp import web

from kubeserve.api.dashboard import OPEN_PATHS as DASHBOARD_PATHS
from kubeserve.api.server import OPENAPI_KEY, OPENAPI_PATH, create_app
from support.common import http
from support.kubeserve_start import Kubeserve


class _LocalLikeBackend:
    """Enough of a backend to build the route table: one internal route, as the local one has."""

    def internal_routes(self) -> list[web.RouteDef]:
        async def snapshot(request: web.Request) -> web.Response:
            return web.json_response({})

        return [web.get("/-/snapshot", snapshot)]


def test_every_public_route_is_in_the_document() -> None:
    app = create_app(_LocalLikeBackend())  # type: ignore[arg-type]
    document = app[OPENAPI_KEY]
    operations = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    # Every operation is also served under the second server's prefix, /namespaces/{namespace}.
    bare, namespaced = document["servers"]
    assert bare["url"] == "/" and namespaced["url"] == "/namespaces/{namespace}"
    routed = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and route.resource.canonical not in DASHBOARD_PATHS  # the page and files: not operations
    }
    missing = {
        (method, path)
        for method, path in {(m, p.removeprefix(namespaced["url"])) for m, p in routed}
        if path != "/-/snapshot"  # backend-internal: the data plane's, not the admin API's
        and (method, path) not in operations
        and (method, path + "/") not in operations  # the same endpoint without its slash
    }
    assert not missing, f"routes missing from {OPENAPI_PATH}: {sorted(missing)}"
    assert len(routed) > len(operations)  # the slash-less aliases were looked at too
    assert ("GET", OPENAPI_PATH) in operations


def test_document_is_served_with_models_from_the_schema(kubeserve: Kubeserve) -> None:
    status, document = http("GET", f"{kubeserve.api}{OPENAPI_PATH}")
    assert status == 200
    assert document["openapi"].startswith("3.")
    put = document["paths"]["/api/serve/applications/"]["put"]
    ref = put["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert schema["properties"]["applications"]["maxItems"] == 1000
    assert "400" in put["responses"]
    assert "security" not in document  # no token configured on this server
