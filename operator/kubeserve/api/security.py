"""Who may talk to the admin API: the bearer token and the Host-header check.

The admin API deploys arbitrary Python (an ``import_path`` plus a ``working_dir`` URL), so whoever
reaches it runs code on the machine. Two guards, both off unless :class:`AdminSecurity` turns them
on (``kubeserve start`` builds it from the command line; the operator leaves both off and relies
on its Service and NetworkPolicy):

* **Bearer token.** Every request must carry ``Authorization: Bearer <token>``, which is what Ray
  2.60's own clients send when ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` (or
  ``RAY_AUTH_TOKEN_PATH``) are set; ``X-Ray-Authorization`` is accepted too, as Ray accepts it
  behind proxies that use ``Authorization`` themselves. Answers follow Ray's dashboard, whose
  errors the ``serve`` client explains to its user: 401 when no token was sent, 403 when the token
  is wrong, both JSON and with ``WWW-Authenticate: Bearer``. Tokens are compared with
  :func:`hmac.compare_digest`.

  Open without a token, as in Ray's dashboard: ``/-/healthz`` (load balancers and probes carry no
  token, and it says nothing but "success"). ``/api/ray/version`` is *not* open: Ray authenticates
  it and the Ray client sends its token there first. The backend's internal routes (the local
  controller's discovery long-poll) are not guarded by this token either: the data-plane processes
  calling them do not have it; those handlers check the data plane's own secret.

* **Host check** (DNS rebinding). A browser page from ``evil.example`` that rebinds its name to
  127.0.0.1 reaches a loopback-bound admin API with ``Host: evil.example``. While the API listens
  on loopback, only the loopback names are accepted: ``localhost``, ``127.0.0.1``, ``[::1]`` and the
  bound address, with any port (the Ray client and ``kubeserve`` send ``Host: 127.0.0.1:8265``);
  anything else is a 403. A request without a Host header (HTTP/1.0) is not a browser's and
  passes. Bound to another address the API needs a token anyway, and names cannot be known.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import string
from collections.abc import Collection
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from kubeserve.api.errors import Handler, error_response

__all__ = [
    "AdminSecurity",
    "is_loopback",
    "loopback_hosts",
    "route_path",
    "security_middleware",
]

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class AdminSecurity:
    """The guards of one admin server; the defaults turn both off.

    ``auth_token``: the bearer token every request must carry, but those to the paths the
    middleware is told are exempt.
    ``allowed_hosts``: lowercase host names (IPv6 in brackets, no port) accepted in the Host
    header; ``None`` accepts any.
    """

    auth_token: str | None = None
    allowed_hosts: frozenset[str] | None = None


#: The least guessing work a token must take on an admin API reachable from other machines.
MIN_TOKEN_BITS = 128


def token_bits(token: str) -> float:
    """A generous estimate of the bits of ``token``: its length times the bits per character of
    the smallest usual alphabet it fits (decimal digits, hex, base64url, printable ASCII)."""
    if not token:
        return 0.0
    chars = set(token)
    if chars <= set("0123456789"):
        per_char = math.log2(10)
    elif chars <= set("0123456789abcdef") or chars <= set("0123456789ABCDEF"):
        per_char = 4.0
    elif chars <= set(string.ascii_letters + string.digits + "-_=+/"):
        per_char = 6.0
    else:
        per_char = math.log2(95)
    if len(chars) == 1:  # "aaaa...": one character repeated is one guess per length
        return math.log2(len(token) + 1)
    return len(token) * per_char


def weak_token_problem(token: str) -> str | None:
    """Why ``token`` is too weak to guard an admin API on a non-loopback address, or None."""
    bits = token_bits(token)
    if bits >= MIN_TOKEN_BITS:
        return None
    return (
        f"the admin token has about {bits:.0f} bits; an admin API reachable from other machines "
        f"needs at least {MIN_TOKEN_BITS} (for example 32 hex digits: "
        "python3 -c 'import secrets; print(secrets.token_hex(16))')"
    )


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_hosts(bound: str) -> frozenset[str]:
    """The Host names a loopback-bound admin server answers: the loopback names and ``bound``."""
    host = bound.strip("[]").lower()
    if ":" in host:  # an IPv6 literal is written in brackets in a Host header
        host = f"[{host}]"
    return frozenset({*_LOOPBACK_NAMES, host})


def route_path(request: web.Request) -> str:
    """The path pattern of the route a request matched (``/namespaces/{namespace}/`` for
    ``/namespaces/team-a/``), or its path when it matched none: what the exempt paths name."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def security_middleware(security: AdminSecurity, token_exempt: Collection[str]) -> Middleware:
    """The aiohttp middleware enforcing ``security``; requests routed to ``token_exempt`` paths
    (the open endpoints, the dashboard's files and the backend's internal routes: see
    :func:`route_path`) skip the token check, not the Host check."""
    expected = security.auth_token.encode() if security.auth_token else None
    allowed = security.allowed_hosts

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if allowed is not None:
            refusal = _host_refusal(request, allowed)
            if refusal is not None:
                return refusal
        if expected is not None and route_path(request) not in token_exempt:
            refusal = _token_refusal(request, expected)
            if refusal is not None:
                return refusal
        return await handler(request)

    return guard


def _host_refusal(request: web.Request, allowed: frozenset[str]) -> web.Response | None:
    host = request.headers.get("Host")
    if host is not None and _host_name(host) in allowed:
        return None
    names = ", ".join(sorted(allowed))
    shown = "missing" if host is None else repr(host[:200])
    return error_response(
        403,
        f"Host header {shown} is not an address of this server: the admin API listens on "
        f"loopback and answers only the Host names {names} (with any port), which protects it "
        "from DNS rebinding; connect to one of them",
        [{"loc": ["header", "Host"], "msg": "not a loopback name of this server"}],
    )


def _host_name(host: str) -> str:
    """``host`` without its port, lowercase: ``[::1]:8265`` -> ``[::1]``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _token_refusal(request: web.Request, expected: bytes) -> web.Response | None:
    header = request.headers.get("Authorization") or request.headers.get("X-Ray-Authorization")
    if not header:
        return _unauthorized(
            401,
            "authentication required: send 'Authorization: Bearer <token>' with the token "
            "kubeserve start was given (kubeserve commands: KUBESERVE_AUTH_TOKEN or "
            "--auth-token-file; Ray's serve: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN)",
            'Bearer realm="kubeserve"',
        )
    scheme, _, credentials = header.strip().partition(" ")
    given = credentials.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, expected):
        return _unauthorized(
            403,
            "authentication failed: the bearer token is not the one kubeserve start was given",
            'Bearer realm="kubeserve", error="invalid_token"',
        )
    return None


def _unauthorized(status: int, message: str, challenge: str) -> web.Response:
    detail = "no bearer token" if status == 401 else "wrong bearer token"
    response = error_response(
        status, message, [{"loc": ["header", "Authorization"], "msg": detail}]
    )
    response.headers["WWW-Authenticate"] = challenge
    return response
