"""A custom autoscaling policy given by import path decides the replica count of real pods: the
operator asks it in the application's policy host pod and applies Ray's bounds; a policy that
raises leaves the count and says so in the deployment's status."""

from __future__ import annotations

from typing import Any

from support.common import wait_for
from support.k8s_operator import (
    SMALL_REPLICA,
    OperatorProcess,
    application,
    instance,
    ready_pods,
    wait_ready,
)
from support.node_cluster import NodeCluster

FAST = {"metricsIntervalS": 0.5, "upscaleDelayS": 0, "downscaleDelayS": 0}


def scaled(policy: dict[str, Any], **autoscaling: Any) -> dict[str, Any]:
    config = {"minReplicas": 1, "maxReplicas": 4, **FAST, "policy": policy, **autoscaling}
    return {"name": "Scaled", "autoscalingConfig": config, **SMALL_REPLICA}


def ready(node: NodeCluster, namespace: str, app: str) -> int:
    selector = f"kubeserve.io/application={app},app.kubernetes.io/component=replica"
    return len(ready_pods(node, namespace, selector))


def scaled_status(node: NodeCluster, namespace: str, app: str) -> dict[str, Any]:
    status = node.get("serveapplication", app, namespace).get("status") or {}
    return dict((status.get("deployments") or {}).get("Scaled") or {})


def test_an_import_path_policy_sets_the_replica_count_of_real_pods(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    namespace = node_namespace
    fixed = {"policyFunction": "ray_policy_app:FixedCount", "policyKwargs": {"count": 3}}
    broken = {"policyFunction": "ray_policy_app:broken_policy"}
    node.apply(
        [
            instance(namespace),
            application(namespace, "fixed", "ray_policy_app:app", deployments=[scaled(fixed)]),
            application(
                namespace,
                "broken",
                "ray_policy_app:app",
                deployments=[scaled(broken, initialReplicas=2)],
            ),
        ]
    )
    wait_ready(node, node_operator, namespace, "fixed")
    wait_for(lambda: ready(node, namespace, "fixed") == 3, 180, what="3 replica pods")
    entry = scaled_status(node, namespace, "fixed")
    assert entry["targetReplicas"] == 3, entry
    assert "from 1 to 3" in entry["lastScalingDecision"]["reason"], entry

    # a count over max_replicas is clamped to it, as Ray's wrapper does
    fixed["policyKwargs"] = {"count": 9}
    node.apply(application(namespace, "fixed", "ray_policy_app:app", deployments=[scaled(fixed)]))
    wait_for(lambda: ready(node, namespace, "fixed") == 4, 180, what="max_replicas (4) pods")

    # a policy that raises: the count stays, the status says why
    wait_ready(node, node_operator, namespace, "broken")
    wait_for(
        lambda: (
            "the policy exploded" in scaled_status(node, namespace, "broken").get("message", "")
        ),
        120,
        what="the policy's error in the status",
    )
    entry = scaled_status(node, namespace, "broken")
    assert "replica count unchanged" in entry["message"], entry
    assert entry["status"] == "HEALTHY", entry
    assert ready(node, namespace, "broken") == 2
