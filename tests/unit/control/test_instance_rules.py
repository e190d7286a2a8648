"""Rules about the instance as a whole: which application may take a route, which options are
fixed while it runs."""

from __future__ import annotations

from kubeserve.control.instance import immutable_option_conflict, prefix_in_use, tracing_config


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


def test_tracing_config_reaches_the_data_plane_only_when_enabled_with_defaults_filled() -> None:
    assert tracing_config({}) is None
    assert tracing_config({"tracing_config": None}) is None
    assert tracing_config({"tracing_config": {"enabled": False, "sampling_ratio": 1}}) is None
    assert tracing_config({"tracing_config": {"enabled": True}}) == {
        "enabled": True,
        "exporter_import_path": "",
        "sampling_ratio": 0.01,
    }


def test_tracing_config_is_fixed_while_the_serving_layer_runs() -> None:
    off: dict[str, object] = {}
    on = {"tracing_config": {"enabled": True, "sampling_ratio": 1.0}}
    assert immutable_option_conflict(None, on) is None  # nothing runs yet
    assert immutable_option_conflict(off, {"tracing_config": {"enabled": False}}) is None
    assert (
        immutable_option_conflict(on, {"tracing_config": {"sampling_ratio": 1.0, "enabled": True}})
        is None
    )
    for before, after in [(off, on), (on, off), (on, {"tracing_config": {"enabled": True}})]:
        conflict = immutable_option_conflict(before, after)
        assert conflict is not None and conflict.startswith("tracing_config"), conflict
