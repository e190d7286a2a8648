"""Status writes of the operator: merge patches that remove what is gone, restart accounting."""

from __future__ import annotations

from typing import Any

from kubeserve.backends.kubernetes.context import _with_removals, replica_key


def test_map_entries_that_disappeared_are_deleted_by_the_patch() -> None:
    old = {"applications": {"a": {"status": "RUNNING"}, "gone": {"status": "RUNNING"}}, "x": 1}
    new = {"applications": {"a": {"status": "RUNNING"}}, "x": 2}
    assert _with_removals(old, new) == {
        "applications": {"a": {"status": "RUNNING"}, "gone": None},
        "x": 2,
    }


def test_a_restarted_container_is_a_new_replica() -> None:
    def pod(restarts: int) -> dict[str, Any]:
        return {
            "metadata": {"uid": "u1"},
            "status": {"containerStatuses": [{"restartCount": restarts}]},
        }

    assert replica_key(pod(0)) != replica_key(pod(1))
    assert replica_key(pod(1)) == replica_key(pod(1))
