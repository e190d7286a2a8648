"""Ray's scheduling fields on several nodes (kwok's fake ones: even nodes ``pool=a``, odd ones
``pool=b``): ``ray_actor_options.label_selector`` picks the nodes, ``max_replicas_per_node`` caps
each, ``ray_actor_options.accelerator_type`` takes only nodes labelled with that type."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubeserve.backends.kubernetes.render_pod import ACCELERATOR_LABEL
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


def unschedulable(plane: KwokCluster, namespace: str, app: str) -> bool:
    """Every replica pod of ``app`` exists and the scheduler found no node for it."""
    selector = f"kubeserve.io/application={app},app.kubernetes.io/component=replica"
    pods = plane.get("pods", namespace=namespace, selector=selector)["items"]
    return bool(pods) and all(
        any(
            c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c.get("reason") == "Unschedulable"
            for c in p["status"].get("conditions", [])
        )
        for p in pods
    )


def test_accelerator_type_places_replicas_only_on_nodes_of_that_type(
    kwok: KwokCluster, kwok_namespace: str, kwok_operator: OperatorProcess
) -> None:
    ns = kwok_namespace
    a100 = kwok.nodes[:2]  # one pool=a node, one pool=b node
    for node in a100:
        kwok.kubectl("label", "node", node, f"{ACCELERATOR_LABEL}=A100", "--overwrite")
    try:
        kwok.apply(instance(ns, image=KUBESERVE_IMAGE))
        kwok.apply(
            [
                # four replicas, at most two per node: both A100 nodes, two on each
                probe(
                    ns, "gpus", 4, maxReplicasPerNode=2, rayActorOptions={"acceleratorType": "A100"}
                ),
                # no node has an H100: the replica is not placed anywhere
                probe(ns, "nowhere", 1, rayActorOptions={"acceleratorType": "H100"}),
            ]
        )
        kwok.kubectl("wait", "--for=condition=Ready", "serveapplication/gpus", "-n", ns,
                     "--timeout=180s", timeout=190)  # fmt: skip
        assert placement(kwok, ns, "gpus") == Counter({a100[0]: 2, a100[1]: 2})
        wait_for(lambda: unschedulable(kwok, ns, "nowhere"), 120, what="the H100 replica refused")
        assert placement(kwok, ns, "nowhere") == Counter({"": 1})
        status = kwok.get("serveapplication", "nowhere", ns)["status"]
        assert status["appStatus"] != "RUNNING", status
    finally:
        for node in a100:
            kwok.kubectl("label", "node", node, f"{ACCELERATOR_LABEL}-")
