"""The dashboard's page and files over HTTP: served without the token (they hold no data) but
behind the Host check, with headers that keep the token in the page; the API stays guarded."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kubeserve.api.dashboard import OPEN_PATHS, PAGE_PATH
from kubeserve.api.security import AdminSecurity, loopback_hosts
from kubeserve.api.server import create_app

TOKEN = "t0ken"
APPLICATIONS = "/api/serve/applications/"


class _NoBackend:
    """Nothing the requests below reach: the guards answer first."""

    def internal_routes(self) -> list[web.RouteDef]:
        return []


@web.middleware
async def _refuse_everything(request: web.Request, handler: Any) -> web.StreamResponse:
    """A backend's access control that accepts nobody (as the operator's does without a token)."""
    return web.json_response({"error": "who are you", "details": []}, status=401)


def _serve(check: Callable[[TestClient[Any, Any]], Awaitable[None]], **options: Any) -> None:
    async def run() -> None:
        async with TestClient(TestServer(create_app(_NoBackend(), **options))) as client:  # type: ignore[arg-type]
            await check(client)

    asyncio.run(run())


def test_page_and_files_need_no_token_but_the_api_does() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        for pattern in sorted(OPEN_PATHS):
            path = pattern.format(namespace="team-a")  # the page of one namespace's instance
            response = await client.get(path)
            assert response.status == 200, path
            assert await response.read()
            assert (await client.head(path)).status == 200
        assert (await client.get(APPLICATIONS)).status == 401
        assert (await client.get("/dashboard/../api/serve/applications/")).status == 401
        assert (await client.get("/dashboard/secret.txt")).status == 401  # not a file here

    _serve(check, security=AdminSecurity(auth_token=TOKEN))


def test_a_backends_access_control_is_skipped_only_for_the_page() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        assert (await client.get(PAGE_PATH)).status == 200
        assert (await client.get("/dashboard/dashboard.js")).status == 200
        assert (await client.get(APPLICATIONS)).status == 401

    _serve(check, middlewares=[_refuse_everything])


def test_the_host_check_guards_the_page_too() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        response = await client.get(PAGE_PATH, headers={"Host": "rebound.example"})
        assert response.status == 403
        assert (await client.get(PAGE_PATH, headers={"Host": "localhost:8265"})).status == 200

    _serve(check, security=AdminSecurity(allowed_hosts=loopback_hosts("127.0.0.1")))


def test_headers_forbid_inline_script_framing_and_other_origins() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        for pattern in sorted(OPEN_PATHS):
            headers = (await client.get(pattern.format(namespace="team-a"))).headers
            policy = dict(
                part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";")
            )
            assert policy["default-src"] == "'none'"
            assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no other origin
            assert policy["connect-src"] == "'self'"
            assert policy["frame-ancestors"] == "'none'"
            assert headers["X-Frame-Options"] == "DENY"
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Referrer-Policy"] == "no-referrer"
        page = await client.get(PAGE_PATH)
        assert page.content_type == "text/html"
        script = await client.get("/dashboard/dashboard.js")
        assert script.content_type == "text/javascript"

    _serve(check)


def test_the_page_loads_only_its_own_files() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        html = await (await client.get(PAGE_PATH)).text()
        script = await (await client.get("/dashboard/dashboard.js")).text()
        assert not re.search(r"<script(?![^>]*\ssrc=)", html), "inline script"
        assert not re.search(r"\son[a-z]+=", html), "inline event handler"
        assert not re.search(r"https?://", html + script), "a resource of another origin"
        linked = set(re.findall(r'(?:src|href)="([^"]+)"', html))
        assert linked and linked <= OPEN_PATHS
        assert ".innerHTML" not in script, "server data must be written as text"

    _serve(check)
