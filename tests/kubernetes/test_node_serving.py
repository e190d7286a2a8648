"""kubeserve on a real node: replicas and proxies in containers of the kubeserve image.

The image itself, traffic through a Service's ClusterIP (kube-proxy), ``kubectl logs`` and
``kubectl exec``, the pods' security context enforced by a real runtime (a non-root user, a
read-only root file system), and each pod's metrics port.
"""

from __future__ import annotations

import base64
import json

from prometheus_client.parser import text_string_to_metric_families

from support.common import http, wait_for
from support.k8s_operator import (
    OperatorProcess,
    hello,
    proxy_service_url,
    ready_pods,
    serve_hello,
    text_answer,
    wait_ready,
)
from support.node_cluster import NodeCluster


def test_hello_served_through_the_proxy_service_cluster_ip(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    url = serve_hello(node, node_operator, ns)
    assert url.startswith("http://10.96.")
    assert text_answer(f"{url}?name=node") == "hello, node\n"


def test_replica_runs_as_non_root_resolves_cluster_names_and_logs_to_kubectl_logs(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    node.apply(hello(ns))
    wait_ready(node, node_operator, ns, "hello")
    replica = ready_pods(node, ns, "app.kubernetes.io/component=replica")[0]["metadata"]["name"]
    assert node.kubectl("exec", replica, "-n", ns, "--", "id", "-u").stdout.strip() == "10001"
    touch = node.kubectl("exec", replica, "-n", ns, "--", "touch", "/app/x", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    resolve = ["exec", replica, "-n", ns, "--", "getent", "hosts"]
    cluster_dns = node.kubectl(*resolve, "kubernetes.default").stdout.split()
    assert cluster_dns[:2] == ["10.96.0.1", "kubernetes.default.svc.cluster.local"]
    assert node.kubectl(*resolve, "pypi.org", check=False).returncode != 0  # nothing forwarded
    logs = wait_for(lambda: node.pod_log(ns, replica), 30, what="the replica's log")
    assert f"replica {replica} listening on" in logs, logs


def test_proxy_and_replica_pods_serve_rays_metrics_to_the_token_of_their_secret(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    url = serve_hello(node, node_operator, ns)
    for _ in range(3):
        assert text_answer(url) == "hello, world\n"
    secret = node.get("secret", "default-metrics-token", ns)
    token = base64.b64decode(secret["data"]["token"]).decode()
    wanted = {
        "proxy": "ray_serve_num_http_requests_total",
        "replica": "ray_serve_deployment_request_counter_total",
    }
    for component, name in wanted.items():
        pod = ready_pods(node, ns, f"app.kubernetes.io/component={component}")[0]
        annotations = pod["metadata"]["annotations"]
        port = annotations["prometheus.io/port"]
        metrics = f"http://{pod['status']['podIP']}:{port}{annotations['prometheus.io/path']}"
        assert http("GET", metrics)[0] == 401
        assert http("GET", metrics, headers={"Authorization": "Bearer wrong"})[0] == 403

        def counted(metrics: str = metrics, name: str = name) -> float:
            status, text = http("GET", metrics, headers={"Authorization": f"Bearer {token}"})
            assert status == 200, text
            return sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == name and sample.labels.get("application") == "hello"
            )

        assert wait_for(lambda c=counted: c() >= 3, 30, what=f"{name} of the {component}")


def test_every_node_proxies_run_as_a_daemonset_that_serves(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """``proxy_location: EveryNode`` renders the proxies as a DaemonSet: one ready proxy pod per
    node (here the one node), serving through the proxy Service."""
    ns = node_namespace
    objects = hello(ns)
    objects[0]["spec"]["proxyLocation"] = "EveryNode"
    node.apply(objects)
    wait_ready(node, node_operator, ns, "hello")
    (daemonset,) = node.get("daemonsets", namespace=ns)["items"]
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/component"] == "proxy"
    wait_for(
        lambda: (
            (node.get("daemonset", daemonset["metadata"]["name"], ns).get("status") or {}).get(
                "numberReady"
            )
            == 1
        ),
        60,
        what="the proxy DaemonSet's pod ready on the node",
    )
    assert not node.get("deployments", namespace=ns, selector="app.kubernetes.io/component=proxy")[
        "items"
    ]
    url = proxy_service_url(node, ns, "/hello")
    assert text_answer(url) == "hello, world\n"


def test_access_lines_go_to_a_file_in_each_pod_or_with_the_records_to_kubectl_logs(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """``spec.logs.accessLines``: ``File`` (the default) writes the proxy's and the replica's
    access lines to ``/var/log/kubeserve/access.log`` in their pods, and ``kubectl logs`` keeps
    the records only; ``ContainerOutput`` (patched in: the pods roll) puts them in ``kubectl
    logs``."""
    ns = node_namespace
    url = serve_hello(node, node_operator, ns)

    def served(tag: str) -> list[str]:
        ids = [f"{tag}-{i}" for i in range(3)]
        for rid in ids:
            assert http("GET", url, headers={"X-Request-ID": rid})[0] == 200
        return ids

    def pods(component: str) -> list[str]:
        found = ready_pods(node, ns, f"app.kubernetes.io/component={component}")
        return [p["metadata"]["name"] for p in found if not p["metadata"].get("deletionTimestamp")]

    def access_file(pod: str) -> str:
        cat = ["exec", pod, "-n", ns, "--", "cat", "/var/log/kubeserve/access.log"]
        return node.kubectl(*cat, check=False).stdout

    ids = served("to-file")
    for component in ("proxy", "replica"):
        (pod,) = pods(component)
        lines = wait_for(
            lambda p=pod: (t := access_file(p)) and all(i in t for i in ids) and t,
            30,
            what=f"the {component}'s access lines in its file",
        )
        assert all(f"{i} -- GET /hello 200 " in lines for i in ids), lines
        logs = node.pod_log(ns, pod)
        assert not any(i in logs for i in ids), logs
    assert "listening on" in node.pod_log(ns, pods("replica")[0])  # the records stay there

    patch = {"spec": {"logs": {"accessLines": "ContainerOutput"}}}
    node.kubectl("patch", "serveinstance", "default", "-n", ns, "--type", "merge",
                 "-p", json.dumps(patch))  # fmt: skip

    def rolled() -> bool:
        found = [p for c in ("proxy", "replica") for p in
                 ready_pods(node, ns, f"app.kubernetes.io/component={c}")]  # fmt: skip
        return len(found) == 2 and all(
            "access-log" not in [v["name"] for v in p["spec"]["volumes"]] for p in found
        )

    wait_for(rolled, 180, interval_s=1, what="proxy and replica pods without the access file")
    ids = served("to-output")
    for component in ("proxy", "replica"):
        (pod,) = pods(component)
        wait_for(
            lambda p=pod: all(f"{i} -- GET /hello 200 " in node.pod_log(ns, p) for i in ids),
            30,
            what=f"the {component}'s access lines in kubectl logs",
        )
