"""Planned changes under steady load through the proxy Service fail no request.

A change of ``runtimeEnv.envVars`` (every replica pod is replaced), a scale-down, and ``kubectl
delete pod`` of a replica, each while clients keep sending through the proxy Service's ClusterIP:
proxies stop choosing a replica before it stops taking requests, a terminating replica finishes
what it runs, and a request that finds no replica of its deployment ready waits for one. Ray's
``rolling_update_percentage`` and ``max_surge_percent`` become each Deployment's
``strategy.rollingUpdate``, and the roll keeps within them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from support.common import wait_for
from support.k8s_operator import (
    SMALL_REPLICA,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    wait_ready,
)
from support.load import Load, failures
from support.node_cluster import NodeCluster

REPLICAS = "app.kubernetes.io/component=replica"
#: a request may wait for a replica pod to start (a roll of one replica, Ray's default rollout)
_REQUEST_TIMEOUT_S = 60


def recorder(ns: str, replicas: int, roll: str = "1", **deployment: Any) -> list[dict[str, Any]]:
    """``fault_recorder`` at ``/`` (each request answers its id after a few ms of work), with
    ``replicas`` replicas; a new ``roll`` changes its env vars, so every replica is replaced."""
    env = {"KS_FAULT_DIR": "/tmp", "KS_ROLL": roll}
    spec = {"name": "Recorder", "numReplicas": replicas, **SMALL_REPLICA, **deployment}
    app = application(ns, "faults", "fault_recorder:app", routePrefix="/",
                      runtimeEnv={"envVars": env}, deployments=[spec])  # fmt: skip
    return [instance(ns), app]


def replica_pods(node: NodeCluster, ns: str) -> list[dict[str, Any]]:
    """Every replica pod, terminating ones included."""
    pods: list[dict[str, Any]] = node.get("pods", namespace=ns, selector=REPLICAS)["items"]
    return pods


def ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])
    )


def settled(node: NodeCluster, ns: str, count: int, gone: set[str]) -> bool:
    """Exactly ``count`` replica pods, all Ready, none of ``gone`` (terminating ones included)."""
    pods = replica_pods(node, ns)
    names = {p["metadata"]["name"] for p in pods}
    return len(pods) == count and all(ready(p) for p in pods) and not names & gone


def deploy(node: NodeCluster, operator: OperatorProcess, ns: str, replicas: int, **d: Any) -> str:
    node.apply(recorder(ns, replicas, **d))
    wait_ready(node, operator, ns, "faults")
    wait_for(lambda: settled(node, ns, replicas, set()), 120, what=f"{replicas} replicas Ready")
    url = proxy_service_url(node, ns, "/")
    return url.split("//")[1].split(":")[0]


def under_load(
    host: str, change: Callable[[], None], done: Callable[[], bool], what: str
) -> dict[str, int]:
    """Run ``change`` while clients send through the proxy Service at ``host``; wait for
    ``done``, keep the load a second more; returns the failed requests by kind (and prints the
    figures)."""
    with Load(8000, clients=12, host=host, timeout_s=_REQUEST_TIMEOUT_S) as load:
        wait_for(lambda: load.answered_since(time.monotonic() - 1) > 20, 30, what="load flowing")
        started = time.monotonic()
        change()
        wait_for(done, 180, interval_s=0.5, what=f"{what} finished")
        took = time.monotonic() - started
        end = time.monotonic() + 1.0
        wait_for(lambda: time.monotonic() >= end, 5, interval_s=0.1, what="a second more")
    failed = failures(load.outcomes)
    print(f"{what}: {len(load.outcomes)} requests in {took:.1f} s, failed {failed}")
    assert len(load.outcomes) > 100
    return failed


def test_an_env_vars_change_rolls_every_replica_and_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    before = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    failed = under_load(
        host,
        lambda: node.apply(recorder(ns, 2, roll="2")),
        lambda: settled(node, ns, 2, before),
        "env vars change of 2 replicas",
    )
    assert failed == {}


def test_a_one_replica_roll_makes_requests_wait_for_the_new_replica_not_fail(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """Ray's default rollout (a fifth at a time, at least one, no surge) stops the only replica
    before its replacement starts: requests wait for it."""
    ns = node_namespace
    host = deploy(node, node_operator, ns, 1)
    before = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    failed = under_load(
        host,
        lambda: node.apply(recorder(ns, 1, roll="2")),
        lambda: settled(node, ns, 1, before),
        "env vars change of 1 replica",
    )
    assert failed == {}


def test_a_scale_down_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 3)
    failed = under_load(
        host,
        lambda: node.apply(recorder(ns, 1)),
        lambda: settled(node, ns, 1, set()),
        "scale-down from 3 replicas to 1",
    )
    assert failed == {}


def test_kubectl_delete_pod_of_a_replica_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    victim = replica_pods(node, ns)[0]["metadata"]["name"]
    failed = under_load(
        host,
        lambda: node.kubectl("delete", "pod", victim, "-n", ns, "--wait=false"),
        lambda: settled(node, ns, 2, {victim}),
        "kubectl delete pod of 1 of 2 replicas",
    )
    assert failed == {}


def test_rolling_update_percentage_and_max_surge_percent_bound_the_roll(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """4 replicas, ``max_surge_percent: 25``: one extra pod at a time, none unavailable (Ray keeps
    the running count at the target while it surges)."""
    ns = node_namespace
    knobs = {"rollingUpdatePercentage": 0.5, "maxSurgePercent": 25}
    host = deploy(node, node_operator, ns, 4, **knobs)
    (workload,) = node.get("deployments", namespace=ns, selector=REPLICAS)["items"]
    assert workload["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    before = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    seen: list[tuple[int, int]] = []  # (pods not terminating, of them Ready)

    def done() -> bool:
        pods = [p for p in replica_pods(node, ns) if not p["metadata"].get("deletionTimestamp")]
        seen.append((len(pods), sum(1 for p in pods if ready(p))))
        return settled(node, ns, 4, before)

    failed = under_load(
        host, lambda: node.apply(recorder(ns, 4, roll="2", **knobs)), done, "surge roll of 4"
    )
    assert failed == {}
    assert max(live for live, _ in seen) <= 5, seen
    assert min(serving for _, serving in seen) >= 4, seen
