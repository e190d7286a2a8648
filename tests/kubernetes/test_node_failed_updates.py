"""Updates that fail leave the running version serving, under load through the proxy Service.

A rebuild whose build Job fails (an import path that does not import) makes the application
``DEPLOY_FAILED`` with the reason while its previous replicas keep answering on the same route,
as Ray keeps the previous version when a redeploy fails; a spec that builds recovers it. An
``EveryNode`` proxy roll to a tracing exporter that does not import starts the new proxy pod
beside the old one (the DaemonSet surges), so the old one serves on while the ServeInstance says
why the new one does not (``UNHEALTHY``, ``ProxyFailed``); removing the exporter recovers it.
Each test counts the requests that failed across the whole story: none may.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from support.common import wait_for
from support.k8s_operator import OperatorProcess, wait_ready
from support.load import Load, failures
from support.node_cluster import NodeCluster
from support.node_recorder import deploy, proxy_pods, ready, recorder, replica_pods, settled


def status_when(
    node: NodeCluster, kind: str, name: str, ns: str, wanted: Callable[[dict[str, Any]], bool]
) -> Callable[[], dict[str, Any] | None]:
    """A poll for the resource's status once ``wanted`` holds of it."""

    def poll() -> dict[str, Any] | None:
        status = node.get(kind, name, ns).get("status") or {}
        return status if wanted(status) else None

    return poll


def keeps_answering(load: Load, what: str) -> None:
    """Requests sent from now on are answered 200 (the route still leads to replicas)."""
    since = time.monotonic()
    wait_for(lambda: load.answered_since(since) > 50, 60, interval_s=0.5, what=what)


def test_a_failed_rebuild_keeps_the_previous_version_serving_and_a_fix_recovers(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2)
    before = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    app = ("serveapplication", "faults", ns)
    with Load(8000, clients=12, host=host, timeout_s=60) as load:
        keeps_answering(load, "load flowing")
        node.apply(recorder(ns, 2, import_path="fault_recorder:nowhere"))
        failed = status_when(node, *app, lambda s: s.get("appStatus") == "DEPLOY_FAILED")
        status = wait_for(failed, 300, interval_s=1, what="faults DEPLOY_FAILED")
        assert "nowhere" in status["message"], status
        keeps_answering(load, "answers from the previous version while DEPLOY_FAILED")
        assert {p["metadata"]["name"] for p in replica_pods(node, ns)} == before
        assert status["routePrefix"] == "/" and set(status["deployments"]) == {"Recorder"}

        node.apply(recorder(ns, 2, import_path="fault_recorder:same_app"))  # builds: a new version
        wait_ready(node, node_operator, ns, "faults")
        wait_for(lambda: settled(node, ns, 2, before), 180, what="the new version's 2 replicas")
        keeps_answering(load, "answers from the new version")
    failed_requests = failures(load.outcomes)
    print(f"failed rebuild and its fix: {len(load.outcomes)} requests, failed {failed_requests}")
    assert failed_requests == {}


def test_an_every_node_proxy_roll_that_fails_leaves_the_old_proxy_serving(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    host = deploy(node, node_operator, ns, 2, proxy_location="EveryNode")
    serving = recorder(ns, 2, proxy_location="EveryNode")[0]
    (daemon_set,) = node.get("daemonsets", namespace=ns)["items"]
    rolling = daemon_set["spec"]["updateStrategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (1, 0)
    (old_proxy,) = (p["metadata"]["name"] for p in proxy_pods(node, ns))
    exporter = "ks_tracing_exporter:nowhere"  # the module is in the image, the function is not
    instance = ("serveinstance", "default", ns)
    with Load(8000, clients=12, host=host, timeout_s=60) as load:
        keeps_answering(load, "load flowing")
        serving["spec"]["tracingConfig"] = {"enabled": True, "exporterImportPath": exporter}
        node.apply([serving])
        unhealthy = status_when(node, *instance, lambda s: s.get("state") == "UNHEALTHY")
        status = wait_for(unhealthy, 180, interval_s=1, what="the instance UNHEALTHY")
        assert f"exporter_import_path {exporter!r}" in status["message"], status
        (condition,) = status["conditions"]
        assert (condition["status"], condition["reason"]) == ("False", "ProxyFailed"), status
        keeps_answering(load, "answers through the old proxy while the new one fails")
        pods = {p["metadata"]["name"]: p for p in proxy_pods(node, ns)}
        assert len(pods) == 2 and ready(pods[old_proxy]), list(pods)  # the new one beside it

        del serving["spec"]["tracingConfig"]
        node.apply([serving])
        running = status_when(node, *instance, lambda s: s.get("state") == "RUNNING")
        wait_for(running, 180, interval_s=1, what="the instance RUNNING again")
        keeps_answering(load, "answers after the fix")
    failed_requests = failures(load.outcomes)
    print(f"failed EveryNode proxy roll: {len(load.outcomes)} requests, failed {failed_requests}")
    assert failed_requests == {}
