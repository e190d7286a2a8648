"""Node-level faults on the real node that the operator and the pods ride out.

A replica's container killed behind the kubelet's back (``ctr tasks kill``) is restarted by the
kubelet and serves again; a stopped kubelet leaves the pods serving, and a restarted one takes them
over without restarting any. Under steady traffic through the proxy Service, the API server down
for a minute, etcd restarted, the kubelet restarted and the operator killed fail no request and
run none twice, and the cluster converges afterwards: a change made then reaches Ready, and the
controllers serve a namespace created then (its default service account appears), so the tests
that follow start on a cluster that has caught up.
"""

from __future__ import annotations

import time

from support.common import wait_for
from support.k8s_operator import (
    OperatorProcess,
    serve_hello,
    text_answer,
    wait_ready,
)
from support.load import Load, failures, longest_gap
from support.node_cluster import NodeCluster
from support.node_recorder import REPLICAS, deploy, executed_twice, recorder, settled

#: how long the API server stays down (the issue's minute; longer than the node's 40 s grace)
API_SERVER_DOWN_S = 60.0


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


def test_the_data_plane_serves_through_control_plane_outages(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    processes = node.processes
    assert processes is not None

    def api_server_ready() -> bool:
        return node.kubectl("get", "--raw", "/readyz", check=False).returncode == 0

    def api_server_down() -> None:
        processes.stop("kube-apiserver")
        time.sleep(API_SERVER_DOWN_S)  # the outage itself, not a wait for a condition
        processes.start_again("kube-apiserver")
        wait_for(api_server_ready, 120, interval_s=0.5, what="the API server back")

    def etcd_restarted() -> None:
        processes.stop("etcd")
        processes.start_again("etcd")
        wait_for(api_server_ready, 120, interval_s=0.5, what="the API server on etcd again")

    def operator_killed() -> None:
        assert node_operator.proc is not None
        node_operator.proc.kill()
        node_operator.proc.wait()
        node_operator.start()

    faults = {
        "API server down": api_server_down,
        "etcd restarted": etcd_restarted,
        "kubelet restarted": node.restart_kubelet,
        "operator killed": operator_killed,
    }
    report = {}
    with Load(8000, clients=4, host=host, timeout_s=30) as load:
        for name, fault in faults.items():
            start = time.monotonic()
            fault()
            time.sleep(5)  # the aftermath counts too: what reconnects, resyncs, re-lists
            end = time.monotonic()
            window = [o for o in list(load.outcomes) if start <= o.started <= end]
            report[name] = (len(window), failures(window), longest_gap(window, start, end))
    twice = executed_twice(node, ns)
    for name, (sent, failed, gap) in report.items():
        print(f"{name}: {sent} sent, failed {failed}, longest gap {gap:.2f} s")
    print(f"executed twice, all faults: {len(twice)}")
    assert all(sent > 20 for sent, _, _ in report.values()), report
    assert {name: failed for name, (_, failed, _) in report.items() if failed} == {}
    assert not twice, f"requests executed more than once: {list(twice.items())[:10]}"
    # Everything converges afterwards: a change made now reaches Ready.
    node.apply(recorder(ns, 3))
    wait_for(lambda: settled(node, ns, 3, set()), 180, what="the third replica Ready")
    wait_ready(node, node_operator, ns, "faults")
    # The controller-manager's informers resynced too: after the outages its namespace watch can
    # lag the API server for a while (the next namespace's service account came 30 s late once).
    fresh = node.create_namespace("after-faults", timeout_s=180)
    node.delete_namespace(fresh)
