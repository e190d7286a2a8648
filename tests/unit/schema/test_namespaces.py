"""Which instance an admin API path addresses: ``/namespaces/<namespace>/...`` or the bare path."""

from __future__ import annotations

import pytest

from kubeserve.schema.namespaces import namespace_problem, split_namespace


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/serve/applications/", (None, "/api/serve/applications/")),
        ("/namespaces/team-a/api/ray/version", ("team-a", "/api/ray/version")),
        ("/namespaces/team-a/", ("team-a", "/")),
        ("/namespaces/team-a", ("team-a", "/")),
        ("/namespaces/", ("", "/")),
        ("/namespacesx/a/api", (None, "/namespacesx/a/api")),
        ("/", (None, "/")),
    ],
)
def test_split_namespace(path: str, expected: tuple[str | None, str]) -> None:
    assert split_namespace(path) == expected


@pytest.mark.parametrize("name", ["default", "team-a", "a", "0", "a" * 63, "1-2-3"])
def test_dns_1123_labels_are_namespaces(name: str) -> None:
    assert namespace_problem(name) is None


@pytest.mark.parametrize(
    "name", ["", "Team-A", "team_a", "-a", "a-", "a.b", "a/b", "a" * 64, "..", "é", "a b"]
)
def test_other_names_are_refused_saying_what_a_namespace_is(name: str) -> None:
    problem = namespace_problem(name)
    assert problem is not None
    assert problem.startswith(f"invalid namespace {name!r} in the path: ")
    assert "DNS-1123 label" in problem and "at most 63" in problem
