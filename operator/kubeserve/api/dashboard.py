"""The dashboard: one static page at ``/`` that draws the admin API's own answers in a browser.

The page (``static/dashboard.html``) and its script and style under ``/dashboard/`` are files
shipped in the package; there is no build step and nothing from another origin. The script polls
``GET /api/serve/applications/`` (applications, deployments, replicas, proxies; recent events are
the status changes it sees between polls) and, when the server has one, ``GET /metrics``
(Prometheus text with Ray Serve's metric names) for request rates and latency; without it the page
says "metrics not available" rather than show a number.

Security. These files hold no data, so they are served to anyone who passes the Host check
(:mod:`kubeserve.api.security`: a page of a rebound name gets a 403 here as on the API) but
without the bearer token: a browser cannot add an ``Authorization`` header to a navigation. Every
request that returns data goes through the script's ``fetch`` with ``Authorization: Bearer``, so it
meets the same checks as any client (the token of ``kubeserve start``, or the operator's
TokenReview and RBAC). When the API answers 401 or 403 the page asks for the token and keeps it in
the tab's ``sessionStorage`` (gone with the tab, never in a cookie, so no other site's page can
make the browser send it). The headers below keep that token away from other scripts: a Content
Security Policy admitting only these files (no inline script, no other origin, server data written
as text), no framing (clickjacking), no referrer, no MIME sniffing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from aiohttp import web

from kubeserve.schema.namespaces import NAMESPACE_PREFIX

__all__ = ["ASSETS_PREFIX", "OPEN_PATHS", "PAGE_PATH", "SECURITY_HEADERS", "dashboard_routes"]

#: Where the page is served.
PAGE_PATH = "/"
#: Where its files are served: a prefix no admin API path starts with.
ASSETS_PREFIX = "/dashboard/"

#: Headers of every dashboard response.
SECURITY_HEADERS = {
    "Content-Security-Policy": "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Revalidate: after an upgrade the page must not run the previous version's script.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class _Asset:
    path: str
    filename: str
    content_type: str


_ASSETS = (
    _Asset(PAGE_PATH, "dashboard.html", "text/html"),
    # The same page for the instance of one namespace (its script reads which from the address).
    _Asset(NAMESPACE_PREFIX + "/", "dashboard.html", "text/html"),
    _Asset(NAMESPACE_PREFIX, "dashboard.html", "text/html"),
    _Asset(ASSETS_PREFIX + "dashboard.js", "dashboard.js", "text/javascript"),
    _Asset(ASSETS_PREFIX + "dashboard.css", "dashboard.css", "text/css"),
    _Asset(ASSETS_PREFIX + "favicon.svg", "favicon.svg", "image/svg+xml"),
)

#: The route paths that serve the page and its files: open without a token (they hold no data).
OPEN_PATHS = frozenset(asset.path for asset in _ASSETS)


def dashboard_routes() -> list[web.RouteDef]:
    """GET (and HEAD) routes for the page and its files, read from the package once, here."""
    static = files("kubeserve.api").joinpath("static")
    return [_route(asset, static.joinpath(asset.filename).read_bytes()) for asset in _ASSETS]


def _route(asset: _Asset, body: bytes) -> web.RouteDef:
    async def serve(request: web.Request) -> web.Response:
        return web.Response(
            body=body, content_type=asset.content_type, charset="utf-8", headers=SECURITY_HEADERS
        )

    return web.get(asset.path, serve)
