"""Multiplex-aware routing end to end: an application written as Ray's documentation writes it
(``@serve.multiplexed(max_num_models_per_replica=1)``, three replicas), deployed through the admin
API to a real ``kubeserve start``. Requests cycling over three models through the proxy (the
``serve_multiplexed_model_id`` header) or through a handle (``multiplexed_model_id=``) find the
replica that already holds their model: each model is loaded about once, where routing blind to
the model would load one for most requests."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from support.common import wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

MODEL_HEADER = "serve_multiplexed_model_id"
MODELS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    state = tmp_path_factory.mktemp("kubeserve-mux")
    with running_kubeserve(state, args=("--num-cpus", "64")) as ks:
        applications = [
            {
                "name": "mux-http",
                "route_prefix": "/models",
                "import_path": "ray_multiplex_routing_app:models_app",
            },
            {
                "name": "mux-handle",
                "route_prefix": "/caller",
                "import_path": "ray_multiplex_routing_app:caller_app",
            },
        ]
        status, body = ks.put(applications)
        assert status == 200, body
        for app in applications:
            ks.wait_app(str(app["name"]), timeout_s=120)
        wait_for(lambda: routes_to_three(ks, "/models?who=1", 1), 60, what="the proxy to know 3")
        wait_for(lambda: routes_to_three(ks, "/caller?who=20", 20), 60, what="the handle to know 3")
        yield ks


def routes_to_three(ks: Kubeserve, path: str, calls: int) -> bool:
    """Whether requests without a model reach all three replicas of ``Models`` within 60 calls:
    the caller (the proxy, the handle in ``Caller``) knows them all. Discovery reaches callers a
    moment after the controller reports the application RUNNING; a caller that knows two of the
    three replicas thrashes their one model slot each, which the tests below would count."""
    seen: set[str] = set()
    conn = http.client.HTTPConnection("127.0.0.1", ks.proxy_port, timeout=30)
    try:
        for _ in range(60 // calls):
            conn.request("GET", path)
            response = conn.getresponse()
            body = json.loads(response.read())
            assert response.status == 200, body
            seen.update(a["replica"] for a in (body if isinstance(body, list) else [body]))
            if len(seen) == 3:
                return True
    finally:
        conn.close()
    return False


def total_loads(answers: list[dict[str, Any]]) -> int:
    """Models loaded so far by the replicas that answered (each answer carries its replica's
    running count)."""
    loads: dict[str, int] = {}
    for answer in answers:
        loads[answer["replica"]] = max(loads.get(answer["replica"], 0), answer["loads"])
    return sum(loads.values())


def get(conn: http.client.HTTPConnection, path: str, model: str) -> tuple[dict[str, Any], dict]:
    conn.request("GET", path, headers={MODEL_HEADER: model})
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, body
    return json.loads(body), {k.lower(): v for k, v in response.getheaders()}


def test_requests_through_the_proxy_go_where_their_model_is_loaded(instance: Kubeserve) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", instance.proxy_port, timeout=30)
    answers = []
    try:
        for i in range(60):
            model = MODELS[i % 3]
            answer, headers = get(conn, "/models", model)
            assert answer["model"] == f"model {model}"
            assert not any(name.startswith("x-kubeserve") for name in headers)  # internal only
            answers.append(answer)
    finally:
        conn.close()
    # Three replicas, one model each: every model finds its own replica and stays there.
    assert total_loads(answers) <= 5, answers
    served_by = {model: {a["replica"] for a in answers[i::3]} for i, model in enumerate(MODELS)}
    assert all(len(replicas) == 1 for replicas in served_by.values()), served_by
    assert len(set().union(*served_by.values())) == 3


def test_concurrent_requests_through_the_proxy_settle_on_their_models(
    instance: Kubeserve,
) -> None:
    def client(offset: int) -> list[dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", instance.proxy_port, timeout=30)
        try:
            return [get(conn, "/models", MODELS[(offset + i) % 3])[0] for i in range(30)]
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = [a for batch in pool.map(client, range(3)) for a in batch]
    assert all(a["model"].split()[1] in MODELS for a in answers)
    # 90 requests; blind to the model, about 60 of them would load one (counted since the
    # replicas started, the test before included)
    assert total_loads(answers) <= 12, answers


def handle_calls(instance: Kubeserve, query: str) -> list[dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", instance.proxy_port, timeout=60)
    try:
        conn.request("GET", "/caller?models=" + ",".join(MODELS) + query)
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body
        answers: list[dict[str, Any]] = json.loads(body)
        return answers
    finally:
        conn.close()


def test_handle_calls_go_where_their_model_is_loaded(instance: Kubeserve) -> None:
    answers = handle_calls(instance, "&n=60")
    assert [a["model"] for a in answers] == [f"model {MODELS[i % 3]}" for i in range(60)]
    assert [a["x"] for a in answers] == list(range(60))
    assert total_loads(answers) <= 5, answers
    served_by = {model: {a["replica"] for a in answers[i::3]} for i, model in enumerate(MODELS)}
    assert all(len(replicas) == 1 for replicas in served_by.values()), served_by


def test_streamed_handle_calls_go_where_their_model_is_loaded(instance: Kubeserve) -> None:
    answers = handle_calls(instance, "&n=30&stream=1")
    assert [a["model"] for a in answers] == [f"model {MODELS[i % 3]}" for i in range(30)]
    # counted since the replicas started: the unstreamed calls before loaded them, if they ran
    assert total_loads(answers) <= 5, answers
