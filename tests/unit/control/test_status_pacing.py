"""Status pacing: what a reader acts on is written at once, progress alone at most every
interval, and never lost."""

from __future__ import annotations

from typing import Any

from kubeserve.control.status_pacing import PROGRESS_INTERVAL_S, progress_only, write_delay


def _status(ready: int, app: str = "DEPLOYING", model: str = "UPDATING") -> dict[str, Any]:
    return {
        "appStatus": app,
        "message": "",
        "readyDeployments": "0/1",
        "replicas": f"{ready}/5",
        "observedGeneration": 2,
        "deployments": {
            "Model": {
                "status": model,
                "message": f"{ready}/5 replicas ready",
                "replicas": 5,
                "readyReplicas": ready,
                "targetReplicas": 5,
            }
        },
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "Deploying", "message": f"{ready}/5"}
        ],
    }


def test_counts_and_messages_alone_are_progress() -> None:
    assert progress_only(_status(1), _status(2))
    assert progress_only(_status(2), _status(2))


def test_a_status_change_is_not_progress() -> None:
    assert not progress_only(_status(4), _status(5, app="RUNNING"))
    assert not progress_only(_status(4), _status(5, model="HEALTHY"))
    assert not progress_only(_status(2), {**_status(2), "observedGeneration": 3})
    ready = _status(5)
    ready["conditions"][0]["status"] = "True"
    assert not progress_only(_status(5), ready)


def test_a_deployment_added_or_removed_is_not_progress() -> None:
    more = _status(1)
    more["deployments"]["Ingress"] = dict(more["deployments"]["Model"])
    assert not progress_only(_status(1), more)
    assert not progress_only(more, _status(1))
    assert not progress_only({}, _status(1))  # the first status


def test_progress_waits_for_the_interval_since_the_last_write() -> None:
    old, new = _status(1), _status(2)
    assert write_delay(old, new, None, 100.0) == 0.0  # never written by this process
    assert write_delay(old, new, 100.0, 100.5) == PROGRESS_INTERVAL_S - 0.5
    assert write_delay(old, new, 100.0, 100.0 + PROGRESS_INTERVAL_S) == 0.0


def test_a_status_change_is_written_at_once() -> None:
    assert write_delay(_status(4), _status(5, app="RUNNING"), 100.0, 100.1) == 0.0
