"""kubeserve on a real node: replicas and proxies in containers of the kubeserve image.

What the kubelet stand-in could not show: the image itself, traffic through a Service's ClusterIP
(kube-proxy), ``kubectl logs`` and ``kubectl exec``, and the pods' security context enforced by a
real runtime (a non-root user, a read-only root file system).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_operator import OperatorProcess, application, instance, ready_pods, wait_ready
from node_cluster import NodeCluster

from kubeserve_testing import http, wait_for


@pytest.fixture
def node_operator(
    node: NodeCluster, node_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator on the host (its pods are real), watching ``node_namespace``."""
    process = OperatorProcess(node, node_namespace, tmp_path / "operator.log")
    process.start()
    yield process
    process.stop()


def node_instance(namespace: str) -> dict[str, Any]:
    """A ServeInstance whose pods run the locally built image (no registry to pull from)."""
    manifest = instance(namespace)
    manifest["spec"].update(image="kubeserve:0.1.0", imagePullPolicy="Never")
    return manifest


def answer(url: str) -> str | None:
    try:
        status, body = http("GET", url)
    except OSError:
        return None
    return body if status == 200 else None


def test_hello_served_through_the_proxy_service_cluster_ip(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    node.apply([node_instance(ns),
                application(ns, "hello", "examples.hello:app", routePrefix="/hello")])  # fmt: skip
    wait_ready(node, node_operator, ns, "hello")
    service = node.get("service", "default-proxy", ns)
    cluster_ip = service["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.96.")
    body = wait_for(lambda: answer(f"http://{cluster_ip}:8000/hello?name=node"), 60,
                    what="an answer through the proxy Service")  # fmt: skip
    assert body == "hello, node\n"


def test_replica_runs_as_non_root_with_its_log_in_kubectl_logs(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    node.apply([node_instance(ns),
                application(ns, "hello", "examples.hello:app", routePrefix="/hello")])  # fmt: skip
    wait_ready(node, node_operator, ns, "hello")
    replica = ready_pods(node, ns, "app.kubernetes.io/component=replica")[0]["metadata"]["name"]
    assert node.kubectl("exec", replica, "-n", ns, "--", "id", "-u").stdout.strip() == "10001"
    touch = node.kubectl("exec", replica, "-n", ns, "--", "touch", "/app/x", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    logs = wait_for(lambda: node.pod_log(ns, replica), 30, what="the replica's log")
    assert f"replica {replica} listening on" in logs, logs
