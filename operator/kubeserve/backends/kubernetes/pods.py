"""What the operator reads off a pod: readiness, why it stopped, and which replica process it
is; and off a workload, why it cannot create its pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's ``Ready`` condition is ``True`` (its readiness probe passes)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def creation_failure(workload: Mapping[str, Any] | None) -> str:
    """Why ``workload`` (a Deployment) cannot create its pods, from its ``ReplicaFailure``
    condition (Pod Security refusing the pod, a ResourceQuota exhausted...), "" when it can."""
    for condition in ((workload or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            why = condition.get("message") or condition.get("reason") or "no reason given"
            return f"pods cannot be created: {why}"
    return ""


def last_exit(container: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``terminated`` state of a container status: its current one, else its last (a
    container restarting after it ended), else None."""
    state = (container.get("state") or {}).get("terminated")
    return state or (container.get("lastState") or {}).get("terminated") or None


def exit_failure(pod: dict[str, Any]) -> str | None:
    """Why a pod that is not ready stopped: a container's last exit with an error, with the last
    line of its termination message (the reason the process gave last, its log's last line with
    ``terminationMessagePolicy: FallbackToLogsOnError``), or None: a ready pod, one being
    deleted, or one that did not fail (still starting)."""
    if pod_ready(pod) or pod["metadata"].get("deletionTimestamp"):
        return None
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = last_exit(container)
        if not ended or ended.get("exitCode") in (0, None):
            continue
        reason = str(ended.get("reason") or "")
        why = f"exited with code {ended['exitCode']}"
        if reason and reason != "Error":  # OOMKilled, ContainerCannotRun...
            why += f" ({reason})"
        lines = str(ended.get("message") or "").strip().splitlines()
        said = f": {lines[-1].strip()[-1000:]}" if lines else ""
        return f"pod {pod['metadata']['name']}: {why}{said}"
    return None


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
