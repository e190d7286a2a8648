"""The ``fault_recorder`` application behind a node's proxy Service, for tests that count failed
requests under load (:class:`support.load.Load` sends ``GET /`` and checks each answer)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from support.common import wait_for
from support.k8s_operator import (
    SMALL_REPLICA,
    TESTS_IMAGE,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    wait_ready,
)
from support.load import Load, failures
from support.node_cluster import NodeCluster

REPLICAS = "app.kubernetes.io/component=replica"
PROXIES = "app.kubernetes.io/component=proxy"


def recorder(
    ns: str,
    replicas: int,
    roll: str = "1",
    *,
    image: str = TESTS_IMAGE,
    import_path: str = "fault_recorder:app",
    proxy_location: str = "HeadOnly",
    **deployment: Any,
) -> list[dict[str, Any]]:
    """The instance (its proxies at ``proxy_location``) and ``fault_recorder`` at ``/`` (each
    request answers its id after a few ms of work), with ``replicas`` replicas; a new ``roll``
    changes its env vars, a new ``image`` (of the instance) or ``import_path`` its code, so every
    replica is replaced."""
    env = {"KS_FAULT_DIR": "/tmp", "KS_ROLL": roll}
    spec = {"name": "Recorder", "numReplicas": replicas, **SMALL_REPLICA, **deployment}
    app = application(ns, "faults", import_path, routePrefix="/",
                      runtimeEnv={"envVars": env}, deployments=[spec])  # fmt: skip
    serving = instance(ns, image=image)
    serving["spec"]["proxyLocation"] = proxy_location
    return [serving, app]


def replica_pods(node: NodeCluster, ns: str) -> list[dict[str, Any]]:
    """Every replica pod, terminating ones included."""
    pods: list[dict[str, Any]] = node.get("pods", namespace=ns, selector=REPLICAS)["items"]
    return pods


def proxy_pods(node: NodeCluster, ns: str) -> list[dict[str, Any]]:
    """Every proxy pod, terminating ones included."""
    pods: list[dict[str, Any]] = node.get("pods", namespace=ns, selector=PROXIES)["items"]
    return pods


def proxy_replaced(node: NodeCluster, ns: str, gone: set[str], image: str | None = None) -> bool:
    """Exactly one proxy pod, Ready, none of ``gone``, running ``image`` when given."""
    pods = proxy_pods(node, ns)
    return (
        len(pods) == 1
        and ready(pods[0])
        and pods[0]["metadata"]["name"] not in gone
        and image in (None, pods[0]["spec"]["containers"][0]["image"])
    )


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


def executed_twice(node: NodeCluster, ns: str) -> dict[str, int]:
    """Request ids ``fault_recorder``'s replica pods executed more than once (each execution is
    a line of its ``executions-<pid>`` files)."""
    ran: collections.Counter[str] = collections.Counter()
    for pod in node.get("pods", namespace=ns, selector=REPLICAS)["items"]:
        name = pod["metadata"]["name"]
        out = node.kubectl("exec", name, "-n", ns, "--", "sh", "-c", "cat /tmp/executions-*")
        ran.update(line.split()[0] for line in out.stdout.splitlines() if line.strip())
    return {rid: n for rid, n in ran.items() if n > 1}


#: a request may wait for a replica pod to start (a roll of one replica, Ray's default rollout)
_REQUEST_TIMEOUT_S = 60


def under_load(
    host: str, change: Callable[[], object], done: Callable[[], bool], what: str
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
