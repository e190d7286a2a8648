"""Rules about the instance as a whole: which application may take a route."""

from __future__ import annotations

from kubeserve.control.instance import prefix_in_use


def test_a_route_another_application_serves_is_refused_in_rays_words() -> None:
    live = {"a": "/a", "b": None}
    assert prefix_in_use("c", "/a", live) == (
        'Prefix /a is being used by application "a". Failed to deploy application "c".'
    )


def test_an_application_keeps_its_own_route_and_no_route_never_conflicts() -> None:
    live = {"a": "/a", "b": None}
    assert prefix_in_use("a", "/a", live) is None
    assert prefix_in_use("c", None, live) is None
    assert prefix_in_use("c", "/a/b", live) is None
