"""Autoscaling on one machine: real replicas report their load, the controller scales them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, slow_app

#: reacts within seconds (Ray's defaults wait 30 s up and 10 min down)
FAST = {
    "metrics_interval_s": 0.5,
    "look_back_period_s": 2.0,
    "upscale_delay_s": 0.0,
    "downscale_delay_s": 2.0,
}


@contextmanager
def load(url: str, connections: int) -> Iterator[list[int]]:
    """``connections`` clients sending requests back to back until the block ends."""
    stop = threading.Event()
    statuses: list[int] = []

    def client() -> None:
        while not stop.is_set():
            try:
                statuses.append(http("GET", url, timeout=60)[0])
            except OSError:
                statuses.append(0)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        for thread in threads:
            thread.join(70)


def deployment_details(ks: Kubeserve, app: str, name: str) -> dict[str, Any]:
    details = ks.app(app) or {"deployments": {}}
    return dict(details["deployments"].get(name) or {})


def running(ks: Kubeserve, app: str, name: str) -> int:
    replicas = deployment_details(ks, app, name).get("replicas", [])
    return sum(1 for r in replicas if r["state"] == "RUNNING")


def test_load_scales_replicas_up_then_idle_scales_them_down(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    config = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1, **FAST}
    status, body = ks.put([slow_app({"name": "Slow", "autoscaling_config": config})])
    assert status == 200, body
    ks.wait_app("slow")
    dep = deployment_details(ks, "slow", "Slow")
    assert dep["target_num_replicas"] == 1
    assert dep["autoscaling_detail"]["scaling_status"] == "STABLE"

    with load(f"{ks.proxy}/slow?s=0.5", connections=6) as statuses:
        wait_for(lambda: running(ks, "slow", "Slow") == 3, 90, what="3 running replicas")
        dep = deployment_details(ks, "slow", "Slow")
        assert dep["target_num_replicas"] == 3
        decisions = dep["autoscaling_detail"]["decisions"]
        assert decisions[-1]["curr_num_replicas"] == 3
        assert "Upscaling" in decisions[0]["reason"]
    assert set(statuses) == {200}

    wait_for(lambda: running(ks, "slow", "Slow") == 1, 90, what="back to 1 replica")
    dep = deployment_details(ks, "slow", "Slow")
    assert dep["target_num_replicas"] == 1
    assert "Downscaling" in dep["autoscaling_detail"]["decisions"][-1]["reason"]


def test_num_replicas_auto_reports_rays_defaults(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([slow_app({"name": "Slow", "num_replicas": "auto"})])[0] == 200
    ks.wait_app("slow")
    config = deployment_details(ks, "slow", "Slow")["deployment_config"]
    assert config["autoscaling_config"]["max_replicas"] == 100
    assert config["autoscaling_config"]["min_replicas"] == 1
    assert config["autoscaling_config"]["target_ongoing_requests"] == 2


def test_handle_call_to_a_deployment_scaled_to_zero_starts_a_replica(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    to_zero = {"min_replicas": 0, "max_replicas": 2, **FAST, "downscale_to_zero_delay_s": 2.0}
    app = slow_app({"name": "Slow", "autoscaling_config": to_zero}, graph="front")
    assert ks.put([app])[0] == 200
    ks.wait_app("front")
    assert running(ks, "front", "Slow") == 0
    assert deployment_details(ks, "front", "Slow")["target_num_replicas"] == 0

    status, answer = http("GET", f"{ks.proxy}/front", timeout=60)
    assert status == 200, answer
    assert answer["backend_pid"]
    decisions = deployment_details(ks, "front", "Slow")["autoscaling_detail"]["decisions"]
    assert decisions[0]["prev_num_replicas"] == 0 and decisions[0]["curr_num_replicas"] == 1

    wait_for(lambda: running(ks, "front", "Slow") == 0, 60, what="scale back to zero")
    assert deployment_details(ks, "front", "Slow")["target_num_replicas"] == 0


def scale(ks: Kubeserve, app: str, deployment: str, body: Any) -> tuple[int, Any]:
    url = f"{ks.api}/api/v1/applications/{app}/deployments/{deployment}/scale"
    return http("POST", url, body, headers=ks.headers)


def test_external_scaler_sets_the_replica_count(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([slow_app(external_scaler_enabled=True)])[0] == 200
    ks.wait_app("slow")
    status, body = scale(ks, "slow", "Slow", {"target_num_replicas": 3})
    assert (status, body) == (
        200,
        {"message": "Scaling request received. Deployment will get scaled asynchronously."},
    )
    wait_for(lambda: running(ks, "slow", "Slow") == 3, 60, what="3 replicas")
    assert deployment_details(ks, "slow", "Slow")["target_num_replicas"] == 3
    assert scale(ks, "slow", "Slow", {"target_num_replicas": 0})[0] == 200
    wait_for(lambda: running(ks, "slow", "Slow") == 0, 60, what="no replicas")

    assert scale(ks, "slow", "Nope", {"target_num_replicas": 1})[0] == 404
    assert scale(ks, "nope", "Slow", {"target_num_replicas": 1})[0] == 404
    status, body = scale(ks, "slow", "Slow", {"target_num_replicas": -1})
    assert status == 400 and body["details"][0]["loc"] == ["target_num_replicas"]
    assert scale(ks, "slow", "Slow", {"replicas": 1})[0] == 400


def test_external_scaling_of_an_app_that_did_not_opt_in_is_412(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    assert ks.put([slow_app()])[0] == 200
    ks.wait_app("slow")
    status, body = scale(ks, "slow", "Slow", {"target_num_replicas": 2})
    assert status == 412
    assert "external_scaler_enabled" in body["error"]


def test_target_capacity_scales_every_deployment_by_its_percentage(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    fixed = slow_app({"name": "Slow", "num_replicas": 4})
    assert ks.put([fixed], target_capacity=50)[0] == 200
    ks.wait_app("slow")
    assert running(ks, "slow", "Slow") == 2
    assert deployment_details(ks, "slow", "Slow")["target_num_replicas"] == 2
    assert ks.details()["target_capacity"] == 50

    assert ks.put([fixed], target_capacity=0)[0] == 200
    wait_for(lambda: running(ks, "slow", "Slow") == 0, 60, what="no replicas at 0%")
    assert ks.put([fixed])[0] == 200
    wait_for(lambda: running(ks, "slow", "Slow") == 4, 60, what="4 replicas without a capacity")


def test_the_first_request_to_an_app_scaled_to_zero_waits_for_a_replica(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    to_zero = {"min_replicas": 0, "max_replicas": 1, **FAST, "upscale_delay_s": 600}
    assert ks.put([slow_app({"name": "Slow", "autoscaling_config": to_zero})])[0] == 200
    ks.wait_app("slow")
    assert running(ks, "slow", "Slow") == 0
    status, answer = http("GET", f"{ks.proxy}/slow?s=0", timeout=60)
    assert status == 200, answer
    decisions = deployment_details(ks, "slow", "Slow")["autoscaling_detail"]["decisions"]
    assert (decisions[0]["prev_num_replicas"], decisions[0]["curr_num_replicas"]) == (0, 1)
