"""Imperative deploys, as Ray's documentation and users' scripts do them: the application defined
in a driver script and deployed from it with ``serve.run``, run as ``python -m kubeserve.compat
FILE`` against a real ``kubeserve start`` (with a token) that cannot import the script: what its
build and replicas run came in the pickled graph. Then how such applications live beside the
ones deployed by config, as in Ray 2.60."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.common import ROOT, http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

DRIVERS = ROOT / "tests" / "drivers"
TOKEN = "imperative-test-token"


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-imperative"), token=TOKEN) as ks:
        yield ks


def run_driver(ks: Kubeserve, script: str, cwd: Path, **env: str) -> Any:
    """Run ``tests/drivers/<script>`` as a user would (from another folder); its last JSON line."""
    environment = dict(os.environ)
    environment.pop("PYTHONPATH", None)
    environment.update(
        KUBESERVE_ADDRESS=ks.api,
        KUBESERVE_AUTH_TOKEN=TOKEN,
        KUBESERVE_STATE_DIR=str(ks.state_dir),
        PROXY_URL=ks.proxy,
        PYTHONPATH=str(ROOT / "operator"),
        **env,
    )
    result = subprocess.run(
        [sys.executable, "-m", "kubeserve.compat", str(DRIVERS / script)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr + ks.log()
    return json.loads(result.stdout.strip().splitlines()[-1])


def applications(ks: Kubeserve, api_type: str = "") -> dict[str, Any]:
    query = f"?api_type={api_type}" if api_type else ""
    status, body = http("GET", f"{ks.api}/api/serve/applications/{query}", headers=ks.headers)
    assert status == 200, body
    return dict(body["applications"])


def test_quickstart_deployed_at_the_top_level_of_its_script(ks: Kubeserve, tmp_path: Path) -> None:
    assert run_driver(ks, "quickstart.py", tmp_path) == {"sum": 5}
    app = ks.app("quickstart")
    assert app is not None and app["status"] == "RUNNING"
    assert app["source"] == "imperative" and "deployed_app_config" not in app
    assert set(app["deployments"]) == {"Ingress", "Adder"}
    assert "quickstart" in applications(ks, "imperative")
    assert "quickstart" not in applications(ks, "declarative")


def test_an_application_bound_inside_a_function(ks: Kubeserve, tmp_path: Path) -> None:
    assert run_driver(ks, "bound_in_function.py", tmp_path) == {"greeting": "Bonjour, Ada!"}


def test_applications_bound_under_a_main_guard_and_passed_straight_to_run(
    ks: Kubeserve, tmp_path: Path
) -> None:
    assert run_driver(ks, "main_guard.py", tmp_path) == {"echo": "HI!", "next": 42}
    counter = ks.app("counter")
    assert counter is not None and counter["route_prefix"] is None


def test_handles_streams_fastapi_and_delete_from_the_driver(ks: Kubeserve, tmp_path: Path) -> None:
    assert run_driver(ks, "handles.py", tmp_path) == {
        "twice": 12,
        "streamed": [0, 1, 2],
        "awaited": 20,
        "http": {"double": 42},
        "after_delete": False,
    }


def test_nonblocking_run_then_requests_with_a_module_beside_the_script(
    ks: Kubeserve, tmp_path: Path
) -> None:
    answers = run_driver(ks, "nonblocking.py", tmp_path)["answers"]
    assert answers == [f"score={3 * v}" for v in range(4)]


def test_a_graph_that_cannot_be_pickled_fails_in_the_driver_naming_the_object(
    ks: Kubeserve, tmp_path: Path
) -> None:
    out = run_driver(ks, "unpicklable.py", tmp_path)
    assert "argument 0 of Guarded.bind()['lock']" in out["error"], out
    assert "_thread.lock" in out["error"]
    assert "guarded" not in out["apps"]


def test_a_graph_over_the_limit_is_a_413_naming_it(ks: Kubeserve, tmp_path: Path) -> None:
    before = applications(ks)
    out = run_driver(ks, "too_large.py", tmp_path)
    assert "413" in out["error"] and "4194304 bytes" in out["error"], out
    assert "holder" not in out["apps"]
    assert applications(ks).keys() == before.keys()


def test_an_imperative_put_without_the_token_is_401_and_changes_nothing(ks: Kubeserve) -> None:
    before = applications(ks)
    body = {"graph": base64.b64encode(b"not even a pickle").decode()}
    status, _ = http("PUT", f"{ks.api}/api/kubeserve/applications/intruder", body)
    assert status == 401
    status, _ = http("DELETE", f"{ks.api}/api/kubeserve/applications/quickstart")
    assert status == 401
    assert applications(ks).keys() == before.keys()


def test_a_config_put_keeps_imperative_applications_it_does_not_list(
    ks: Kubeserve, tmp_path: Path
) -> None:
    """Ray 2.60's ``apply_app_configs``: a declarative deploy removes only the declarative
    applications it leaves out; a route another application serves is refused (409), and an
    application the config names replaces the imperative one of that name."""
    run_driver(ks, "quickstart.py", tmp_path)
    declarative = {"name": "decl", "route_prefix": "/decl", "import_path": "examples.hello:app"}
    assert ks.put([declarative])[0] == 200
    ks.wait_app("decl")
    imperative = {name for name, app in applications(ks).items() if app["source"] == "imperative"}
    assert {"quickstart", "greeter", "echo", "counter", "scored"} <= imperative

    taken = {"name": "thief", "route_prefix": "/quickstart", "import_path": "examples.hello:app"}
    status, body = ks.put([declarative, taken])
    assert status == 409, body
    assert 'Prefix /quickstart is being used by application "quickstart"' in body["error"]
    assert "thief" not in applications(ks)

    assert ks.put([])[0] == 200
    wait_for(lambda: "decl" not in applications(ks), 60, what="decl to be removed")
    assert ks.app("quickstart")["status"] == "RUNNING"  # type: ignore[index]

    replacing = {"name": "greeter", "route_prefix": "/greet", "import_path": "examples.hello:app"}
    assert ks.put([replacing])[0] == 200
    wait_for(
        lambda: (
            applications(ks)["greeter"]["source"] == "declarative"
            and applications(ks)["greeter"]["status"] == "RUNNING"
        ),
        60,
        what="greeter to run from its config",
    )


def test_a_module_that_calls_serve_run_at_its_top_level_builds_from_its_import_path(
    ks: Kubeserve,
) -> None:
    """The build imports it and its ``serve.run`` returns at once: it never waits on itself."""
    app = {"name": "self-deploying", "route_prefix": "/self", "import_path": ""}
    app["import_path"] = "ray_self_deploying_app:app"
    assert ks.put([app])[0] == 200
    found = ks.wait_app("self-deploying", timeout_s=60)
    assert found["source"] == "declarative"
    status, text = http("GET", f"{ks.proxy}/self")
    assert (status, text) == (200, "hello from a self-deploying module")


def test_imperative_applications_come_back_after_a_restart(ks: Kubeserve) -> None:
    """The pickled graph is kept with the desired state: a restarted instance runs it again."""
    ks.stop()
    ks.start()
    app = ks.wait_app("quickstart", timeout_s=90)
    assert app["source"] == "imperative"
    status, body = http("GET", f"{ks.proxy}/quickstart?x=10")
    assert (status, body) == (200, {"sum": 12})


def test_a_policy_function_of_the_driver_script_decides_the_replica_count(
    ks: Kubeserve, tmp_path: Path
) -> None:
    assert run_driver(ks, "custom_policy.py", tmp_path) == {
        "replicas": {"RUNNING": 3},
        "answer": "ok",
    }
    model = (ks.app("policed") or {})["deployments"]["Model"]
    policy = model["deployment_config"]["autoscaling_config"]["policy"]
    assert policy["policy_function"] == "__main__.three_replicas"


def user_frame(script: Path, marker: str) -> tuple[str, str]:
    """The start of the traceback line naming ``script``'s line that ends with
    ``# marker: <marker>``, and that line's source as a traceback shows it."""
    lines = script.read_text().splitlines()
    number, source = next(
        (n, line) for n, line in enumerate(lines, 1) if line.endswith(f"# marker: {marker}")
    )
    return f'  File "{script}", line {number}, in ', source.strip()


def test_a_deployments_error_carries_the_users_frames_in_its_remote_traceback(
    ks: Kubeserve, tmp_path: Path
) -> None:
    """As Ray shows them: each frame of the deployment's code (pickled by value from the
    driver's ``__main__``) with its file, line and function, and its source line (the file is
    on this machine); for a sync method (run on a worker thread) as for the others."""
    script = DRIVERS / "remote_traceback.py"
    out = run_driver(ks, "remote_traceback.py", tmp_path)
    refuse_frame, refuse_source = user_frame(script, "refuse")
    calls = [("check", "check"), ("check_async", "check_async"), ("count", "count")]
    for value, (call, function) in enumerate([*calls, ("front", "__call__")], 1):
        assert out[call]["type"] == "RayTaskError(ValueError)" and out[call]["value_error"]
        text = out[call]["text"]
        frame, source = user_frame(script, call)
        assert f"{frame}{function}\n    {source}\n" in text, text
        assert f"{refuse_frame}refuse\n    {refuse_source}\n" in text, text
        assert text.endswith(f"ValueError: negative value: -{value}"), text
    check_frame, _ = user_frame(script, "check")
    nested = out["front"]["text"]
    assert "\nray.exceptions.RayTaskError(ValueError): " in nested and check_frame in nested
