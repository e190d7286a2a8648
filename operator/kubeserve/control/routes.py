"""The HTTP route table: which deployment serves a request path.

Routing is longest-prefix match on path-segment boundaries (admin API spec, section 2.2). With
routes at ``/a`` and ``/a/b``: ``/a``, ``/a/``, ``/a/c`` go to ``/a``; ``/a/b``, ``/a/b/``,
``/a/b/c`` go to ``/a/b``; ``/ab`` matches neither; ``/`` is a catch-all.

Pure logic, no I/O. A :class:`RouteTable` is immutable once built: the proxy builds a new one for
each discovery snapshot and swaps the reference, so a request in flight keeps the table it matched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

__all__ = [
    "Route",
    "RouteTable",
    "needs_normalizing",
    "normalize_path",
    "normalize_prefix",
    "origin_form",
]


class Route(TypedDict):
    """One HTTP route; structurally the same as ``kubeserve.runtime.wire.Route`` (control sits below
    runtime in the layers, so it spells the shape out instead of importing it)."""

    route_prefix: str
    app: str
    deployment: str


def normalize_prefix(prefix: str) -> str:
    """The canonical spelling of a prefix: leading ``/``, no trailing ``/`` except for ``/``."""
    stripped = prefix.strip("/")
    return "/" + stripped if stripped else "/"


def origin_form(target: bytes) -> bytes:
    """The path and query of a request target sent in absolute-form (``http://host:port/p?q``,
    as a client sends it to a forward proxy), which RFC 9112 section 3.2.2 requires every server
    to accept: ``/p?q`` (``/`` when it names no path). Any other target is returned as it is."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    tail = rest[cut:]
    return tail if tail.startswith(b"/") else b"/" + tail


def needs_normalizing(raw_path: bytes) -> bool:
    """Whether a raw request path (bytes as sent, no query string) may be spelled differently
    from :func:`normalize_path`'s result: it holds a ``%`` escape, a ``/.`` or ``//``. Any other
    path is its own normal form, so callers can skip the work for the common case."""
    return b"%" in raw_path or b"/." in raw_path or b"//" in raw_path


def normalize_path(raw_path: str) -> str:
    """The path a request really names: percent-decoded once (as UTF-8: raw bytes that are not
    UTF-8 stay surrogates, escapes that are not become U+FFFD, as in uvicorn), ``//`` collapsed,
    ``.`` and ``..`` segments resolved (RFC 3986, section 5.2.4; ``..`` never climbs above
    ``/``). A trailing ``/`` is kept, and so is one after a final ``.`` or ``..`` (``/a/b/..`` is
    ``/a/``).

    Routing and user code both see this form (the proxy routes on it, the replica hands it to the
    user), so a route prefix cannot be bypassed by spelling it differently: ``/%61dmin``,
    ``//admin`` and ``/x/../admin`` are all ``/admin``. ``raw_path`` is the request target's path
    decoded as latin-1 (bytes as sent); a path not starting with ``/`` (``*``, an authority) is
    only decoded.
    """
    path = raw_path.encode("latin-1").decode("utf-8", "surrogateescape")
    if "%" in path:  # (urllib.parse, with ipaddress, is imported by the first path with one)
        from urllib.parse import unquote

        path = unquote(path)
    if not path.startswith("/"):
        return path
    if "//" not in path and "/." not in path:
        return path
    out: list[str] = []
    segments = path.split("/")[1:]
    for segment in segments:
        if segment == "..":
            if out:
                out.pop()
        elif segment and segment != ".":
            out.append(segment)
    trailing = segments[-1] in ("", ".", "..") and bool(out)
    return "/" + "/".join(out) + ("/" if trailing else "")


class RouteTable:
    """Longest-prefix matching over a set of routes.

    Invariant: ``_by_prefix`` maps each canonical prefix to exactly one route; when two routes
    claim the same prefix (the controller should prevent it) the first one listed wins.
    """

    __slots__ = ("_by_prefix", "_catch_all", "routes")

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        by_prefix: dict[str, Route] = {}
        for route in routes:
            by_prefix.setdefault(normalize_prefix(route["route_prefix"]), route)
        self._by_prefix = by_prefix
        self._catch_all = by_prefix.get("/")
        self.routes: tuple[Route, ...] = tuple(by_prefix.values())

    def __len__(self) -> int:
        return len(self._by_prefix)

    def match(self, path: str) -> Route | None:
        """The route serving ``path`` (a URL path without query string), or ``None``.

        Cost: one dict lookup per segment boundary of ``path``, longest first, so a hit on the
        most specific prefix (the common case) costs one lookup, whatever the table size.
        """
        by_prefix = self._by_prefix
        # "/a/b/" must behave as "/a/b": a trailing slash never starts a new segment.
        end = len(path)
        if end > 1 and path[end - 1] == "/":
            end -= 1
        while end > 0:
            route = by_prefix.get(path[:end] if end != len(path) else path)
            if route is not None:
                return route
            end = path.rfind("/", 0, end)
        return self._catch_all

    def prefixes(self) -> dict[str, str]:
        """``{route_prefix: app_name}``, the body of the proxy's ``/-/routes`` (as in Ray Serve)."""
        return {prefix: route["app"] for prefix, route in self._by_prefix.items()}
