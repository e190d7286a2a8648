"""Planned changes under steady load through the proxy Service fail no request.

A change of ``runtimeEnv.envVars``, of the instance's image or of the import path (every replica
pod is replaced), a scale-down, ``kubectl delete pod`` of a replica or of the proxy, and a drain
(evictions through the Eviction API), each while keep-alive clients keep sending through the
proxy Service's ClusterIP: proxies stop choosing a replica before it stops taking requests, a
terminating replica finishes what it runs, a request that finds no replica of its deployment
ready waits for one, and a terminating proxy serves until another one is ready, then closes its
connections gracefully (``Connection: close``). A PodDisruptionBudget per deployment keeps a
drain from taking its replicas faster than a roll would. Ray's
``rolling_update_percentage`` and ``max_surge_percent`` become each Deployment's
``strategy.rollingUpdate``, and the roll keeps within them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.common import wait_for
from support.k8s_operator import TESTS_IMAGE, OperatorProcess
from support.node_cluster import NodeCluster
from support.node_recorder import (
    REPLICAS,
    deploy,
    executed_twice,
    proxy_pods,
    proxy_replaced,
    ready,
    recorder,
    replica_pods,
    settled,
    under_load,
)


@pytest.mark.parametrize(
    ("what", "change"),
    [("env vars", {"roll": "2"}), ("import path", {"import_path": "fault_recorder:same_app"})],
)
def test_a_change_of_env_vars_or_import_path_rolls_every_replica_and_fails_no_request(
    node: NodeCluster,
    node_operator: OperatorProcess,
    node_namespace: str,
    what: str,
    change: dict[str, str],
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    before = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    failed = under_load(
        host,
        lambda: node.apply(recorder(ns, 2, **change)),
        lambda: settled(node, ns, 2, before),
        f"{what} change of 2 replicas",
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
    knobs: dict[str, Any] = {"rollingUpdatePercentage": 0.5, "maxSurgePercent": 25}
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


def test_kubectl_delete_pod_of_the_proxy_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """The only proxy of a ``HeadOnly`` instance: its Deployment starts a replacement as the pod
    terminates; the old proxy serves until the replacement is ready behind the Service and
    kube-proxy dropped it, then answers ``Connection: close`` and closes idle connections, so
    the keep-alive clients move to the new proxy. No request fails or runs twice."""
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    (victim,) = (p["metadata"]["name"] for p in proxy_pods(node, ns))
    failed = under_load(
        host,
        lambda: node.kubectl("delete", "pod", victim, "-n", ns, "--wait=false"),
        lambda: proxy_replaced(node, ns, {victim}),
        "kubectl delete pod of the proxy",
    )
    twice = executed_twice(node, ns)
    print(f"executed twice: {len(twice)}")
    assert failed == {}
    assert not twice, list(twice.items())[:10]


def test_an_image_change_rolls_proxy_and_replicas_and_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """``spec.image`` of the instance to a new tag of the same image: the proxy (a surge roll)
    and every replica (Ray's rollout) are replaced."""
    ns = node_namespace
    image = TESTS_IMAGE.replace(":0.1.0", ":rolls")
    node.ctr(
        "images", "tag", "--force", f"docker.io/library/{TESTS_IMAGE}", f"docker.io/library/{image}"
    )
    host = deploy(node, node_operator, ns, 2)
    replicas = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    proxies = {p["metadata"]["name"] for p in proxy_pods(node, ns)}
    failed = under_load(
        host,
        lambda: node.apply(recorder(ns, 2, image=image)),
        lambda: settled(node, ns, 2, replicas) and proxy_replaced(node, ns, proxies, image),
        "image change of the proxy and 2 replicas",
    )
    assert failed == {}
    for pod in replica_pods(node, ns):
        assert pod["spec"]["containers"][0]["image"] == image


def evict(node: NodeCluster, ns: str, pod: str) -> int:
    """Ask the Eviction API to evict ``pod``, as ``kubectl drain`` does: 201 when it goes, 429
    when a PodDisruptionBudget refuses."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns}}  # fmt: skip
    path = f"/api/v1/namespaces/{ns}/pods/{pod}/eviction"
    result = node.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction),
                          check=False)  # fmt: skip
    if result.returncode == 0:
        return 201
    assert "TooManyRequests" in result.stderr, result.stderr
    return 429


def test_a_drain_evicts_one_replica_at_a_time_and_fails_no_request(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """What ``kubectl drain`` does to a node, one eviction at a time through the Eviction API.

    The node is cordoned: the deployment's PodDisruptionBudget lets one replica go and refuses
    the other while the first's replacement cannot start. On a cluster of several nodes the
    replacement would start on another one; here the node plays that part once uncordoned, and
    the other replica goes when the replacement is Ready. The proxy goes last (its replacement
    starts as it terminates, see the proxy test above). No request fails."""
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    (budget,) = node.get("poddisruptionbudgets", namespace=ns)["items"]
    assert budget["spec"]["maxUnavailable"] == 1
    name = budget["metadata"]["name"]
    wait_for(
        lambda: node.get("pdb", name, ns).get("status", {}).get("disruptionsAllowed") == 1,
        30,
        what="the budget to count both replicas",
    )
    first, second = sorted(p["metadata"]["name"] for p in replica_pods(node, ns))
    (proxy,) = (p["metadata"]["name"] for p in proxy_pods(node, ns))
    (node_name,) = (n["metadata"]["name"] for n in node.get("nodes")["items"])
    answers: list[tuple[str, int]] = []

    def drain() -> None:
        node.kubectl("cordon", node_name)
        try:
            answers.append((first, evict(node, ns, first)))
            answers.append((second, evict(node, ns, second)))
        finally:
            node.kubectl("uncordon", node_name)
        wait_for(lambda: evict(node, ns, second) == 201, 120, interval_s=0.5,
                 what="the budget to let the second replica go")  # fmt: skip
        wait_for(lambda: settled(node, ns, 2, {first, second}), 120, what="2 new replicas Ready")
        answers.append((proxy, evict(node, ns, proxy)))

    try:
        failed = under_load(
            host,
            drain,
            lambda: settled(node, ns, 2, {first, second}) and proxy_replaced(node, ns, {proxy}),
            "drain: 2 replicas and the proxy evicted",
        )
    finally:
        node.kubectl("uncordon", node_name)
    assert answers == [(first, 201), (second, 429), (proxy, 201)]
    assert failed == {}
