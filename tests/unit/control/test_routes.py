"""Longest-prefix route matching, as the admin API spec (section 2.2) states it."""

from __future__ import annotations

import pytest

from kubeserve.control.routes import Route, RouteTable, normalize_prefix


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
