"""Node-level faults on the real node that the operator and the pods ride out.

A replica's container killed behind the kubelet's back (``ctr tasks kill``) is restarted by the
kubelet and serves again; a stopped kubelet leaves the pods serving, and a restarted one takes them
over without restarting any.
"""

from __future__ import annotations

from support.common import wait_for
from support.k8s_operator import (
    OperatorProcess,
    serve_hello,
    text_answer,
    wait_ready,
)
from support.node_cluster import NodeCluster

REPLICAS = "app.kubernetes.io/component=replica"


def restarts(node: NodeCluster, ns: str) -> dict[str, int]:
    """pod name -> restarts, for every pod in ``ns``."""
    return {
        p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
        for p in node.get("pods", namespace=ns)["items"]
    }


def test_a_replica_container_killed_with_ctr_is_restarted_and_serves_again(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    url = serve_hello(node, node_operator, ns)
    (pod,) = node.get("pods", namespace=ns, selector=REPLICAS)["items"]
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix(
        "containerd://"
    )
    node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    name = pod["metadata"]["name"]
    wait_for(lambda: restarts(node, ns).get(name, 0) >= 1, 60, what="the container restarted")
    wait_ready(node, node_operator, ns, "hello")
    assert wait_for(lambda: text_answer(url), 60, what="hello served again") == "hello, world\n"


def test_pods_keep_serving_while_the_kubelet_restarts(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    url = serve_hello(node, node_operator, ns)
    before = restarts(node, ns)
    assert node.processes is not None
    node.processes.stop("kubelet")
    assert text_answer(url) == "hello, world\n"  # containers and kube-proxy do not need it
    node.restart_kubelet()
    wait_ready(node, node_operator, ns, "hello")
    assert text_answer(url) == "hello, world\n"
    assert restarts(node, ns) == before
