"""Ray Serve applications written as Ray's documentation writes them, deployed unchanged through
the admin API on a real ``kubeserve start`` (no Ray installed in its environment), answering as they
would on Ray: FastAPI ingress, Starlette requests and responses, model composition, streaming
handles, batching, multiplexing, application builders."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.common import ROOT, streamed_lines, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve


@pytest.fixture(scope="module")
def ray_apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kubeserve, Path]]:
    """One instance serving every example application (deployed once: the machine is shared)."""
    state = tmp_path_factory.mktemp("kubeserve-ray")
    marker = state / "lifespan-shutdown"
    with running_kubeserve(state, args=("--num-cpus", "64")) as ks:
        applications = [
            {
                "name": "fastapi",
                "route_prefix": "/api",
                "import_path": "ray_fastapi_app:fastapi_app",
                "runtime_env": {"env_vars": {"RAY_APP_SHUTDOWN_MARKER": str(marker)}},
            },
            {"name": "starlette", "route_prefix": "/echo", "import_path": "ray_starlette_app:app"},
            {
                "name": "compose",
                "route_prefix": "/compose",
                "import_path": "ray_composition_app:app",
            },
            {"name": "batch", "route_prefix": "/batch", "import_path": "ray_batching_app:app"},
            {
                "name": "sync",
                "route_prefix": "/sync",
                "import_path": "ray_composition_app:sync_app",
            },
            {
                "name": "sync-on-loop",
                "route_prefix": "/sync-on-loop",
                "import_path": "ray_composition_app:sync_app",
                "runtime_env": {"env_vars": {"RAY_SERVE_RUN_SYNC_IN_THREADPOOL": "0"}},
            },
            {
                "name": "multiplex",
                "route_prefix": "/models",
                "import_path": "ray_multiplex_app:inferencer_app",
            },
            {
                "name": "mux-router",
                "route_prefix": "/route-model",
                "import_path": "ray_multiplex_app:router_app",
            },
            {
                "name": "builder",
                "route_prefix": "/built",
                "import_path": "ray_builder_app:app_builder",
                "args": {"message": "from args"},
            },
            {
                "name": "typed-builder",
                "route_prefix": "/typed",
                "import_path": "ray_builder_app.typed_app_builder",
                "args": {"message": "typed args"},
            },
        ]
        status, body = ks.put(applications)
        assert status == 200, body
        for app in applications:
            ks.wait_app(str(app["name"]), timeout_s=120)
        yield ks, marker


def fetch(
    ks: Kubeserve,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", ks.proxy_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def fetch_json(ks: Kubeserve, path: str, **kwargs: Any) -> tuple[int, Any]:
    status, _, body = fetch(ks, path, **kwargs)
    return status, json.loads(body)


# -- FastAPI ingress ------------------------------------------------------------------------------


def test_fastapi_routes_with_path_and_query_params(ray_apps: tuple[Kubeserve, Path]) -> None:
    ks, _ = ray_apps
    assert fetch_json(ks, "/api/") == (200, "Hello, world!")
    status, answer = fetch_json(ks, "/api/items/42?q=blue")
    assert (status, answer) == (200, {"kind": "item", "item_id": 42, "q": "blue"})
    status, headers, _ = fetch(ks, "/api/items/7")
    assert headers["x-served-by"] == "middleware"


def test_fastapi_validation_http_exceptions_and_dependencies(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    status, answer = fetch_json(ks, "/api/items/not-a-number")
    assert status == 422 and answer["detail"][0]["loc"] == ["path", "item_id"]
    body = json.dumps({"name": "pen", "price": 1.5}).encode()
    json_type = {"Content-Type": "application/json"}
    assert fetch_json(ks, "/api/items", method="POST", body=body, headers=json_type) == (
        200,
        {"name": "pen", "price": 1.5},
    )
    bad = json.dumps({"name": "pen"}).encode()
    assert fetch_json(ks, "/api/items", method="POST", body=bad, headers=json_type)[0] == 422
    assert fetch_json(ks, "/api/missing") == (404, {"detail": "no such thing"})
    assert fetch_json(ks, "/api/whoami") == (401, {"detail": "who are you?"})
    assert fetch_json(ks, "/api/whoami", headers={"X-User": "ada"}) == (200, {"user": "ada"})


def test_fastapi_lifespan_state_root_path_and_replica_context(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    status, answer = fetch_json(ks, "/api/state")
    assert status == 200
    assert answer["greeting"] == "hello from lifespan"
    assert answer["root_path"] == "/api"
    assert answer["url"].endswith("/api/state")
    assert answer["replica"] == "MyFastAPIDeployment"


def test_fastapi_docs_and_openapi_under_the_route_prefix(ray_apps: tuple[Kubeserve, Path]) -> None:
    ks, _ = ray_apps
    status, document = fetch_json(ks, "/api/openapi.json")
    assert status == 200
    assert "/items/{item_id}" in document["paths"]
    # self is filled by kubeserve, never a parameter of the API
    params = document["paths"]["/items/{item_id}"]["get"]["parameters"]
    assert {p["name"] for p in params} == {"item_id", "q"}
    status, _, page = fetch(ks, "/api/docs")
    assert status == 200 and b"/api/openapi.json" in page
    assert ks.app("fastapi")["docs_path"] == "/docs"  # type: ignore[index]
    assert ks.app("compose")["docs_path"] is None  # type: ignore[index]


def test_fastapi_streaming_response_arrives_chunk_by_chunk(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    streamed = streamed_lines("127.0.0.1", ks.proxy_port, "/api/stream", timeout_s=30)
    assert (streamed.status, streamed.first, streamed.rest) == (200, b"0\n", b"1\n2\n")
    assert streamed.total >= 0.9  # the app sleeps 0.5 s between chunks
    assert streamed.first_at < streamed.total - 0.5, streamed  # the first chunk came first


# -- Starlette requests and responses --------------------------------------------------------------


def test_plain_ingress_gets_a_starlette_request_and_its_responses_are_sent_as_they_are(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    status, headers, raw = fetch(
        ks,
        "/echo/x?a=1",
        method="POST",
        body=b'{"k": [1, 2]}',
        headers={"Cookie": "session=abc", "Content-Type": "application/json"},
    )
    assert status == 201 and headers["x-echo"] == "yes"
    assert json.loads(raw) == {
        "is_starlette": True,
        "path": "/echo/x",
        "query": {"a": "1"},
        "cookies": {"session": "abc"},
        "body": {"k": [1, 2]},
        "form": None,
    }
    form = urllib.parse.urlencode({"name": "ada"}).encode()
    form_type = {"Content-Type": "application/x-www-form-urlencoded"}
    status, answer = fetch_json(ks, "/echo/form", method="POST", body=form, headers=form_type)
    assert status == 201 and answer["form"] == {"name": "ada"}
    status, headers, raw = fetch(ks, "/echo/text")
    assert (status, raw) == (202, b"plain")
    assert headers["content-type"].startswith("text/plain")


# -- handles --------------------------------------------------------------------------------------


def test_model_composition_passes_responses_between_deployments(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    assert fetch_json(ks, "/compose?input=5") == (200, {"result": 12})


def test_streaming_handle_and_a_generator_called_without_stream(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    status, _, body = fetch(ks, "/compose/stream?n=4")
    assert (status, body) == (200, b"0\n1\n2\n3\n")
    status, answer = fetch_json(ks, "/compose/not-streamed")
    assert status == 200 and "handle.options(stream=True)" in answer["error"]


def test_sync_callers_use_result_and_iterate_streams_on_worker_threads(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    assert fetch_json(ks, "/sync?input=5") == (200, {"result": 15, "streamed": [0, 1, 2]})
    # with RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0 a sync method runs on the event loop, where
    # blocking on .result() is refused (as Ray refuses it there) instead of deadlocking
    status, _, _ = fetch(ks, "/sync-on-loop?input=5")
    assert status == 500


def test_batching_groups_concurrent_requests(ray_apps: tuple[Kubeserve, Path]) -> None:
    ks, _ = ray_apps
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: fetch_json(ks, f"/batch?x={x}"), range(8)))
    assert [a[1]["output"] for a in answers] == [x * 2 for x in range(8)]
    assert max(a[1]["batch_size"] for a in answers) > 1


def test_multiplexed_models_by_header_and_by_handle_option(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    header = "serve_multiplexed_model_id"
    first = fetch_json(ks, "/models", headers={header: "m1"})[1]
    again = fetch_json(ks, "/models", headers={header: "m1"})[1]
    assert first["prediction"] == "m1:x" and again["loads"] == first["loads"]  # cached
    other = fetch_json(ks, "/models", headers={header: "m2"})[1]
    assert other["prediction"] == "m2:x" and other["loads"] == first["loads"] + 1
    assert fetch_json(ks, "/route-model?model=m7") == (200, {"prediction": "m7:y", "loads": 1})


# -- builders -------------------------------------------------------------------------------------


def test_application_builders_take_args_as_dict_or_pydantic_model(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    status, answer = fetch_json(ks, "/built")
    assert status == 200 and answer["message"] == "from args" and answer["app"] == "builder"
    assert answer["replica"]
    assert fetch_json(ks, "/typed")[1]["message"] == "typed args"


def test_args_for_a_bound_application_or_invalid_args_fail_the_deploy(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    current = ks.details()["applications"]
    kept = [
        {k: v for k, v in app["deployed_app_config"].items() if k != "deployments"}
        for app in current.values()
    ]
    bad = [
        {
            "name": "bound-with-args",
            "route_prefix": "/bad1",
            "import_path": "ray_builder_app:bound",
            "args": {"message": "x"},
        },
        {
            "name": "typed-missing",
            "route_prefix": "/bad2",
            "import_path": "ray_builder_app:typed_app_builder",
            "args": {},
        },
    ]
    assert ks.put([*kept, *bad])[0] == 200
    app = ks.wait_app("bound-with-args", "DEPLOY_FAILED")
    assert "application builder" in app["message"]
    app = ks.wait_app("typed-missing", "DEPLOY_FAILED")
    assert "message" in app["message"] and "Field required" in app["message"]
    assert ks.put(kept)[0] == 200
    wait_for(lambda: "typed-missing" not in ks.details()["applications"], 60, what="cleanup")


def test_a_driver_script_runs_deletes_and_calls_applications(
    ray_apps: tuple[Kubeserve, Path],
) -> None:
    ks, _ = ray_apps
    env = dict(os.environ)
    env.update(
        KUBESERVE_ADDRESS=ks.api,
        KUBESERVE_STATE_DIR=str(ks.state_dir),
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT / "operator")]),
    )
    script = ROOT / "tests" / "apps" / "ray_driver_script.py"
    result = subprocess.run(
        [sys.executable, "-m", "kubeserve.compat", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "result": 12,
        "streamed": [0, 1, 2],
        "awaited": 15,
        "status": "RUNNING",
        "after_delete": False,
    }


def test_lifespan_shutdown_runs_when_the_replica_stops(ray_apps: tuple[Kubeserve, Path]) -> None:
    ks, marker = ray_apps
    status, body = ks.put([])
    assert status == 200, body
    wait_for(marker.exists, 60, what="the FastAPI lifespan shutdown")
    assert marker.read_text() == "lifespan shutdown"
