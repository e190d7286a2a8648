"""Ray's scheduling fields on several nodes (kwok's fake ones: even nodes ``pool=a``, odd ones
``pool=b``): ``ray_actor_options.label_selector`` picks the nodes, ``max_replicas_per_node`` caps
each."""

from __future__ import annotations

from collections import Counter
from typing import Any

from support.common import wait_for
from support.k8s_operator import KUBESERVE_IMAGE, OperatorProcess, application, instance
from support.kwok_cluster import KwokCluster


def placement(plane: KwokCluster, namespace: str, app: str) -> Counter[str]:
    """Replica pods of ``app`` per node (Pending ones under "")."""
    selector = f"kubeserve.io/application={app},app.kubernetes.io/component=replica"
    pods = plane.get("pods", namespace=namespace, selector=selector)["items"]
    return Counter(
        p["spec"].get("nodeName", "") for p in pods if "deletionTimestamp" not in p["metadata"]
    )


def pool(plane: KwokCluster, node: str) -> str:
    return str(plane.get("node", node)["metadata"]["labels"]["pool"])


def probe(namespace: str, name: str, replicas: int, **options: Any) -> dict[str, Any]:
    deployment = {"name": "Probe", "numReplicas": replicas, **options}
    return application(
        namespace, name, "e2e_probe:app", routePrefix=f"/{name}", deployments=[deployment]
    )


def test_label_selector_and_max_replicas_per_node_place_replicas_as_asked(
    kwok: KwokCluster, kwok_namespace: str, kwok_operator: OperatorProcess
) -> None:
    ns = kwok_namespace
    kwok.apply(instance(ns, image=KUBESERVE_IMAGE))
    kwok.apply(
        [
            # five pool=a nodes, at most one replica on each: one replica on every one of them
            probe(
                ns,
                "spread",
                5,
                maxReplicasPerNode=1,
                rayActorOptions={"labelSelector": {"pool": "a"}},
            ),
            # not pool a, at most two per node: six replicas over at least three pool=b nodes
            probe(
                ns,
                "pairs",
                6,
                maxReplicasPerNode=2,
                rayActorOptions={"labelSelector": {"pool": "!a"}},
            ),
            # one more than the pool=a nodes can hold at one per node: the sixth stays Pending
            probe(
                ns,
                "full",
                6,
                maxReplicasPerNode=1,
                rayActorOptions={"labelSelector": {"pool": "in(a)"}},
            ),
        ]
    )
    for app in ("spread", "pairs"):
        kwok.kubectl("wait", "--for=condition=Ready", f"serveapplication/{app}", "-n", ns,
                     "--timeout=180s", timeout=190)  # fmt: skip

    spread = placement(kwok, ns, "spread")
    assert sum(spread.values()) == 5 and set(spread.values()) == {1}, spread
    assert {pool(kwok, node) for node in spread} == {"a"}

    pairs = placement(kwok, ns, "pairs")
    assert sum(pairs.values()) == 6 and max(pairs.values()) <= 2, pairs
    assert {pool(kwok, node) for node in pairs} == {"b"}

    def all_six() -> Counter[str] | None:  # five placed, one Pending
        found = placement(kwok, ns, "full")
        return found if sum(found.values()) == 6 and len(found) == 6 else None

    full = wait_for(all_six, 120, what="the six replicas of full placed or Pending")
    assert full[""] == 1, full  # the cap leaves one Pending rather than doubling up
    placed = {node: n for node, n in full.items() if node}
    assert set(placed.values()) == {1} and {pool(kwok, node) for node in placed} == {"a"}
    status = kwok.get("serveapplication", "full", ns)["status"]
    assert status["appStatus"] != "RUNNING", status
