"""Custom request routers end to end (Ray's ``request_router_config.request_router_class``):
routers written as Ray's documentation writes them (``tests/apps/ray_custom_router_app.py``),
deployed through the admin API to a real ``kubeserve start``, choose the replica of every request
through the proxy and through handles; ``record_routing_stats`` reaches them; a class that cannot
be loaded fails the deploy instead of hanging requests."""

from __future__ import annotations

import hashlib
import http.client as httpclient
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from support.common import http
from support.kubeserve_start import Kubeserve, running_kubeserve

APP = "ray_custom_router_app"


def app(name: str, prefix: str, target: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "route_prefix": prefix, "import_path": f"{APP}:{target}", **fields}


def score_of(replica_id: str) -> int:
    """The score a replica of the app reports in ``record_routing_stats`` (the app's rule)."""
    return int(hashlib.sha256(replica_id.encode()).hexdigest()[:8], 16)


def replicas(ks: Kubeserve, name: str, deployment: str) -> list[str]:
    details = ks.app(name)
    assert details is not None
    found = details["deployments"][deployment]["replicas"]
    return sorted(r["replica_id"] for r in found if r["state"] == "RUNNING")


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    state = tmp_path_factory.mktemp("kubeserve-router")
    with running_kubeserve(state, args=("--num-cpus", "64")) as ks:
        two = [{"num_replicas": 2}]
        applications = [
            app("spread", "/spread", "spread_app"),
            app("lowest", "/lowest", "lowest_app"),
            app("scored", "/scored", "scored_app"),
            app(
                "uniform",
                "/uniform",
                "uniform_app",
                deployments=[{"name": "UniformRequestRouterApp", **two[0]}],
            ),
            app(
                "throughput",
                "/throughput",
                "throughput_app",
                deployments=[{"name": "ThroughputAwareRequestRouterApp", **two[0]}],
            ),
            app("caller", "/caller", "caller_app"),
        ]
        status, body = ks.put(applications)
        assert status == 200, body
        for application in applications:
            ks.wait_app(str(application["name"]), timeout_s=180)
        yield ks


def served_by(ks: Kubeserve, path: str, n: int = 30) -> list[dict[str, Any]]:
    conn = httpclient.HTTPConnection("127.0.0.1", ks.proxy_port, timeout=30)
    answers = []
    try:
        for _ in range(n):
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200, body
            answers.append(json.loads(body))
    finally:
        conn.close()
    return answers


def test_the_built_in_router_spreads_requests(instance: Kubeserve) -> None:
    answers = served_by(instance, "/spread")
    assert len({a["replica"] for a in answers}) >= 2, answers


def test_a_deterministic_router_sends_every_request_to_its_replica(instance: Kubeserve) -> None:
    answers = served_by(instance, "/lowest")
    ids = replicas(instance, "lowest", "Lowest")
    assert len(ids) == 3
    assert Counter(a["replica"] for a in answers) == {ids[0]: 30}


def test_handle_calls_are_routed_by_the_custom_router(instance: Kubeserve) -> None:
    status, answers = http("GET", f"{instance.proxy}/caller?n=30", timeout=60)
    assert status == 200, answers
    ids = replicas(instance, "caller", "Lowest")
    assert len(ids) == 3
    assert Counter(a["replica"] for a in answers) == {ids[0]: 30}


def test_routing_stats_reach_the_router(instance: Kubeserve) -> None:
    # TopScoreRouter routes only to replicas whose record_routing_stats it has seen, the highest
    # score first: every request is served, by the replica with the best score.
    answers = served_by(instance, "/scored")
    ids = replicas(instance, "scored", "Scored")
    best = max(ids, key=score_of)
    assert Counter(a["replica"] for a in answers) == {best: 30}
    assert all(a["stats_polls"] >= 1 for a in answers)


def test_the_docs_uniform_router_spreads_requests(instance: Kubeserve) -> None:
    answers = served_by(instance, "/uniform")
    assert {a["replica"] for a in answers} == set(
        replicas(instance, "uniform", "UniformRequestRouterApp")
    )


def test_the_docs_throughput_aware_router_serves(instance: Kubeserve) -> None:
    answers = served_by(instance, "/throughput", n=10)
    assert {a["replica"] for a in answers} <= set(
        replicas(instance, "throughput", "ThroughputAwareRequestRouterApp")
    )


def test_a_malformed_router_class_is_refused_at_put(instance: Kubeserve) -> None:
    status, body = instance.put(
        [
            app(
                "bad",
                "/bad",
                "spread_app",
                deployments=[
                    {"name": "Spread", "request_router_config": {"request_router_class": "x"}}
                ],
            )
        ]
    )
    assert status == 400, body
    assert "request_router_class" in json.dumps(body), body


@pytest.mark.parametrize(
    ("router", "error"),
    [
        ("no_such_router_module:Router", "No module named 'no_such_router_module'"),
        (f"{APP}:NotARouter", "not a subclass of ray.serve.request_router.RequestRouter"),
    ],
)
def test_a_router_class_that_cannot_load_fails_the_deploy(
    tmp_path_factory: pytest.TempPathFactory, router: str, error: str
) -> None:
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-bad-router")) as ks:
        override = {"name": "Spread", "num_replicas": 1}
        override["request_router_config"] = {"request_router_class": router}
        status, body = ks.put([app("broken", "/broken", "spread_app", deployments=[override])])
        assert status == 200, body
        failed = ks.wait_app("broken", "DEPLOY_FAILED", timeout_s=120)
        assert error in json.dumps(failed), failed
        ks.wait_proxy()
        status, text = http("GET", f"{ks.proxy}/broken", timeout=10)
        assert status == 503, text  # at once, naming the application's state
