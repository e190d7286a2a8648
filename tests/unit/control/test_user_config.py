"""One rule for which user_config a replica applies, and when a controller must send one."""

from __future__ import annotations

from kubeserve.control.user_config import needs_push, resolve_user_config, user_config_version


def test_the_applications_config_wins_even_when_it_is_null() -> None:
    assert resolve_user_config({"a": 1}, True, {"a": 2}) == {"a": 2}
    assert resolve_user_config({"a": 1}, True, None) is None
    assert resolve_user_config({"a": 1}, False, None) == {"a": 1}


def test_versions_ignore_key_order_and_a_reported_version_is_never_pushed_again() -> None:
    assert user_config_version({"a": 1, "b": 2}) == user_config_version({"b": 2, "a": 1})
    assert user_config_version({"a": 1}) != user_config_version({"a": 2})
    desired = user_config_version({"a": 1})
    assert not needs_push(desired, desired)
    assert needs_push(None, desired)  # not reported yet
    assert needs_push(user_config_version(None), desired)
