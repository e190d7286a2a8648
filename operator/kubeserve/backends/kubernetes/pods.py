"""What the operator reads off a pod: readiness, and which replica process it is."""

from __future__ import annotations

from typing import Any


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's ``Ready`` condition is ``True`` (its readiness probe passes)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def serving_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods one can talk to: ready, with an address, not being deleted."""
    return [
        pod
        for pod in pods
        if pod_ready(pod)
        and (pod.get("status") or {}).get("podIP")
        and not pod["metadata"].get("deletionTimestamp")
    ]


def replica_key(pod: dict[str, Any]) -> str:
    """One replica process: the pod and its container restart count.

    A restarted container is a new process that has applied only what it read at start-up, so
    it must be counted (and pushed to) afresh.
    """
    restarts = sum(
        int(c.get("restartCount", 0))
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    )
    return f"{pod['metadata']['uid']}/{restarts}"
