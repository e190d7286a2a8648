"""A runtime_env ``working_dir`` on the real node: the init container fetches it into an emptyDir.

The archive (``tests/apps``) is served over HTTP on the bridge address; the replica pod's init
container ``runtime-env`` downloads and unpacks it into the pod's ``emptyDir``, and the replica
imports ``e2e_probe`` from there (the image does not contain it). The replica's health check reads
a file: kubelet probes then take the pod out of the Service and restart the container, and the
pod recovers once the file is gone.
"""

from __future__ import annotations

from typing import Any

from support.common import http, wait_for
from support.k8s_operator import (
    KUBESERVE_IMAGE,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    ready_pods,
    wait_ready,
)
from support.node_cluster import NodeCluster

UNHEALTHY = "/tmp/unhealthy"  # the pod's scratch emptyDir: it survives a container restart
WORKING_DIR = "/var/run/kubeserve/runtime-env/working_dir"


def deploy_probe(node: NodeCluster, operator: OperatorProcess, ns: str, zip_url: str) -> str:
    runtime_env = {"workingDir": zip_url, "envVars": {"KS_HEALTH_FILE": UNHEALTHY}}
    app = application(ns, "probe", "e2e_probe:app", routePrefix="/probe", runtimeEnv=runtime_env)
    node.apply([instance(ns, image=KUBESERVE_IMAGE), app])
    wait_ready(node, operator, ns, "probe")
    return proxy_service_url(node, ns, "/probe")


def replica(node: NodeCluster, ns: str) -> dict[str, Any]:
    (pod,) = node.get("pods", namespace=ns, selector="app.kubernetes.io/component=replica")["items"]
    return pod


def probe_pid(url: str) -> int | None:
    try:
        status, body = http("GET", url)
    except OSError:
        return None
    return int(body["pid"]) if status == 200 else None


def test_working_dir_is_fetched_by_the_init_container_into_an_empty_dir(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, apps_zip_url: str
) -> None:
    ns = node_namespace
    url = deploy_probe(node, node_operator, ns, apps_zip_url)
    assert wait_for(lambda: probe_pid(url), 30, what="the probe app through the Service")
    pod = replica(node, ns)
    # (node-local sockets, the operator's default here, add their own init container first)
    inits = {i["name"]: i for i in pod["status"]["initContainerStatuses"]}
    assert set(inits) in ({"runtime-env"}, {"node-sockets", "runtime-env"}), inits
    init = inits["runtime-env"]
    assert init["state"]["terminated"]["exitCode"] == 0
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert any("emptyDir" in v for v in volumes.values())
    name = pod["metadata"]["name"]
    listing = node.kubectl("exec", name, "-n", ns, "--", "ls", WORKING_DIR).stdout.split()
    assert "e2e_probe.py" in listing
    cwd = node.kubectl("exec", name, "-n", ns, "--", "pwd").stdout.strip()  # symlinks resolved
    assert (
        cwd
        == node.kubectl("exec", name, "-n", ns, "--", "readlink", "-f", WORKING_DIR).stdout.strip()
    )


def test_failing_probes_take_the_replica_out_and_restart_it_until_it_recovers(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str, apps_zip_url: str
) -> None:
    ns = node_namespace
    url = deploy_probe(node, node_operator, ns, apps_zip_url)
    name = replica(node, ns)["metadata"]["name"]
    node.kubectl("exec", name, "-n", ns, "--", "touch", UNHEALTHY)
    wait_for(lambda: not ready_pods(node, ns, "app.kubernetes.io/component=replica"), 30,
             what="the replica pod NotReady (readiness probe failing)")  # fmt: skip
    wait_for(
        lambda: replica(node, ns)["status"]["containerStatuses"][0]["restartCount"] >= 1,
        60,
        what="the kubelet restarting the replica container (liveness probe failing)",
    )

    def healed() -> bool:
        result = node.kubectl("exec", name, "-n", ns, "--", "rm", "-f", UNHEALTHY, check=False)
        return result.returncode == 0

    wait_for(healed, 60, interval_s=1, what="the health file removed")
    wait_for(lambda: ready_pods(node, ns, "app.kubernetes.io/component=replica"), 90,
             what="the replica Ready again")  # fmt: skip
    assert wait_for(lambda: probe_pid(url), 60, what="traffic through the Service again")
    assert replica(node, ns)["metadata"]["name"] == name  # the same pod, restarted in place
