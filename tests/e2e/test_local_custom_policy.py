"""Custom autoscaling policies on one machine (Ray 2.60's ``AutoscalingPolicy``): a policy given
by import path in a config, or as a callable in a driver script, decides the replica count; one
that raises or answers garbage changes nothing and says so in the deployment's message."""

from __future__ import annotations

from typing import Any

from support.common import wait_for
from support.kubeserve_start import Kubeserve

#: decides every half second, no delays
FAST = {"metrics_interval_s": 0.5, "upscale_delay_s": 0.0, "downscale_delay_s": 0.0}


def policy_app(name: str, *deployments: dict[str, Any], graph: str = "app", **fields: Any) -> Any:
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "import_path": f"ray_policy_app:{graph}",
        "deployments": list(deployments),
        **fields,
    }


def scaled(policy: dict[str, Any] | None = None, **config: Any) -> dict[str, Any]:
    autoscaling = {"min_replicas": 1, "max_replicas": 4, **FAST, **config}
    if policy is not None:
        autoscaling["policy"] = policy
    return {"name": "Scaled", "autoscaling_config": autoscaling}


def deployment(ks: Kubeserve, app: str, name: str) -> dict[str, Any]:
    return dict(((ks.app(app) or {}).get("deployments") or {}).get(name) or {})


def running(ks: Kubeserve, app: str, name: str) -> int:
    replicas = deployment(ks, app, name).get("replicas", [])
    return sum(1 for r in replicas if r["state"] == "RUNNING")


def test_a_policy_class_from_an_import_path_sets_the_count_within_the_bounds(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    policy = {"policy_function": "ray_policy_app:FixedCount", "policy_kwargs": {"count": 3}}
    status, body = ks.put([policy_app("fixed", scaled(policy))])
    assert status == 200, body
    wait_for(lambda: running(ks, "fixed", "Scaled") == 3, 60, what="3 replicas")
    decisions = deployment(ks, "fixed", "Scaled")["autoscaling_detail"]["decisions"]
    assert decisions[-1]["policy"] == "ray_policy_app:FixedCount"
    # a count over max_replicas is clamped to it, as Ray does
    policy["policy_kwargs"] = {"count": 9}
    assert ks.put([policy_app("fixed", scaled(policy))])[0] == 200
    wait_for(lambda: running(ks, "fixed", "Scaled") == 4, 60, what="max_replicas")
    assert deployment(ks, "fixed", "Scaled")["status"] == "HEALTHY"


def test_a_policy_that_raises_or_answers_garbage_leaves_the_count_and_says_why(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    broken = scaled({"policy_function": "ray_policy_app:broken_policy"}, initial_replicas=2)
    garbage = scaled({"policy_function": "ray_policy_app.garbage_policy"}, initial_replicas=2)
    status, body = ks.put([policy_app("broken", broken), policy_app("garbage", garbage)])
    assert status == 200, body
    ks.wait_app("broken")
    ks.wait_app("garbage")
    wait_for(
        lambda: "the policy exploded" in deployment(ks, "broken", "Scaled").get("message", ""),
        30,
        what="the policy's error in the message",
    )
    wait_for(
        lambda: "str 'lots'" in deployment(ks, "garbage", "Scaled").get("message", ""),
        30,
        what="the garbage answer in the message",
    )
    for app in ("broken", "garbage"):
        dep = deployment(ks, app, "Scaled")
        assert "replica count unchanged" in dep["message"], dep["message"]
        assert dep["status"] == "HEALTHY"
        assert running(ks, app, "Scaled") == 2


def test_an_application_policy_decides_for_every_deployment(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    deployments = [
        {"name": name, "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, **FAST}}
        for name in ("Ingress", "Scaled")
    ]
    policy = {
        "policy_function": "ray_policy_app:PerDeployment",
        "policy_kwargs": {"counts": {"Ingress": 2, "Scaled": 3}},
    }
    status, body = ks.put(
        [policy_app("both", *deployments, graph="two", autoscaling_policy=policy)]
    )
    assert status == 200, body
    wait_for(
        lambda: (running(ks, "both", "Ingress"), running(ks, "both", "Scaled")) == (2, 3),
        60,
        what="2 and 3 replicas",
    )
