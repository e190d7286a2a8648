"""Longest-prefix route matching, as the admin API spec (section 2.2) states it."""

from __future__ import annotations

import pytest

from kubeserve.control.routes import (
    Route,
    RouteTable,
    needs_normalizing,
    normalize_path,
    normalize_prefix,
    origin_form,
)


def route(prefix: str, app: str = "app", deployment: str = "d") -> Route:
    return {"route_prefix": prefix, "app": app, "deployment": deployment}


@pytest.fixture
def table() -> RouteTable:
    return RouteTable([route("/a", deployment="A"), route("/a/b", deployment="AB")])


@pytest.mark.parametrize("path", ["/a", "/a/", "/a/c", "/a/c/d", "/a/bc"])
def test_paths_under_a_go_to_a(table: RouteTable, path: str) -> None:
    matched = table.match(path)
    assert matched is not None and matched["deployment"] == "A"


@pytest.mark.parametrize("path", ["/a/b", "/a/b/", "/a/b/c", "/a/b/c/"])
def test_paths_under_a_b_go_to_a_b(table: RouteTable, path: str) -> None:
    matched = table.match(path)
    assert matched is not None and matched["deployment"] == "AB"


@pytest.mark.parametrize("path", ["/ab", "/", "", "/b", "/b/a", "/A"])
def test_segment_boundaries_are_respected(table: RouteTable, path: str) -> None:
    assert table.match(path) is None


def test_root_is_a_catch_all() -> None:
    table = RouteTable([route("/", deployment="root"), route("/a", deployment="A")])
    for path in ("/", "", "/ab", "/x/y", "/-/anything"):
        matched = table.match(path)
        assert matched is not None and matched["deployment"] == "root", path
    matched = table.match("/a/x")
    assert matched is not None and matched["deployment"] == "A"


def test_deep_prefixes() -> None:
    table = RouteTable([route("/api/v1/models", deployment="m"), route("/api", deployment="api")])
    assert table.match("/api/v1/models/x")["deployment"] == "m"  # type: ignore[index]
    assert table.match("/api/v1/model")["deployment"] == "api"  # type: ignore[index]
    assert table.match("/api/v1")["deployment"] == "api"  # type: ignore[index]


def test_empty_table_matches_nothing() -> None:
    assert RouteTable().match("/") is None
    assert len(RouteTable()) == 0


def test_first_route_wins_on_duplicate_prefix() -> None:
    table = RouteTable([route("/a", app="one"), route("/a/", app="two")])
    assert table.match("/a")["app"] == "one"  # type: ignore[index]
    assert table.prefixes() == {"/a": "one"}


def test_prefixes_for_routes_endpoint() -> None:
    table = RouteTable([route("/", app="x"), route("/b", app="y")])
    assert table.prefixes() == {"/": "x", "/b": "y"}


@pytest.mark.parametrize(
    ("raw", "canonical"), [("/", "/"), ("", "/"), ("/a", "/a"), ("/a/", "/a"), ("a/b", "/a/b")]
)
def test_normalize_prefix(raw: str, canonical: str) -> None:
    assert normalize_prefix(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/%2D/healthz", "/-/healthz"),
        ("/%2d/healthz", "/-/healthz"),
        ("//-/healthz", "/-/healthz"),
        ("/./-/healthz", "/-/healthz"),
        ("/a/../-/healthz", "/-/healthz"),
        ("/%2F-/healthz", "/-/healthz"),
        ("/%61dmin", "/admin"),
        ("/a/%2e%2e/admin", "/admin"),
        ("/../../admin", "/admin"),
        ("/a/b/", "/a/b/"),
        ("/a/b/.", "/a/b/"),
        ("/a/b/..", "/a/"),
        ("/a/./b//c", "/a/b/c"),
        ("/", "/"),
        ("//", "/"),
        ("/caf%C3%A9", "/café"),
        ("/%252F", "/%2F"),  # decoded once, never twice
        ("/plain/path", "/plain/path"),
    ],
)
def test_paths_are_normalised_once_decoded(raw: str, normal: str) -> None:
    assert normalize_path(raw) == normal
    if normal.isascii() and "%" not in normal:  # (input is bytes as sent, read as latin-1)
        assert normalize_path(normal) == normal  # normalising twice changes nothing


def test_only_paths_with_escapes_or_dot_or_double_slashes_need_normalising() -> None:
    for raw in (b"/%61", b"/a/./b", b"/a/../b", b"//a", b"/a/.hidden"):
        assert needs_normalizing(raw)
    for raw in (b"/", b"/a/b", b"/a.b/c", b"/-/healthz"):
        assert not needs_normalizing(raw)
        assert normalize_path(raw.decode()) == raw.decode()


def test_a_route_prefix_cannot_be_bypassed_by_spelling() -> None:
    table = RouteTable(
        [
            {"route_prefix": "/", "app": "public", "deployment": "P"},
            {"route_prefix": "/admin", "app": "admin", "deployment": "A"},
        ]
    )
    for raw in ("/%61dmin/x", "//admin/x", "/x/../admin/x", "/./admin", "/%2Fadmin"):
        route = table.match(normalize_path(raw))
        assert route is not None and route["app"] == "admin", raw


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"http://localhost:8000/hello?a=b", b"/hello?a=b"),
        (b"http://localhost:8000?a=b", b"/?a=b"),
        (b"http://localhost:8000", b"/"),
        (b"HTTPS://example.com/x", b"/x"),
        (b"/already/origin?q", b"/already/origin?q"),
        (b"*", b"*"),
        (b"ftp://host/x", b"ftp://host/x"),
    ],
)
def test_absolute_form_targets_are_reduced_to_origin_form(target: bytes, expected: bytes) -> None:
    """RFC 9112 3.2.2: a server accepts absolute-form (what a client sends to a forward proxy)."""
    assert origin_form(target) == expected
