"""Describing an application graph, in process and as the ``kubeserve.runtime.build`` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubeserve.runtime.build import BuildError, describe

ROOT = Path(__file__).resolve().parents[2]


def run_build(
    import_path: str, *extra_path: Path, options: tuple[str, ...] = ()
) -> tuple[int, Any, str]:
    env = dict(os.environ)
    paths = [ROOT / "operator", ROOT / "tests" / "apps", *extra_path]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    proc = subprocess.run(
        [sys.executable, "-m", "kubeserve.runtime.build", import_path, *options],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr.decode()


def test_single_deployment_app_with_options_set_in_code() -> None:
    assert describe("ks_echo_app:app") == {
        "ingress": "Echo",
        "deployments": [
            {
                "name": "Echo",
                "options": {
                    "num_replicas": 2,
                    "max_ongoing_requests": 7,
                    "user_config": {"greeting": "hello"},
                },
                "is_function": False,
                "outbound": [],
                "is_ingress": True,
            }
        ],
    }


def test_composed_app_lists_handles_as_outbound_edges() -> None:
    description = describe("ks_composed_app.app")
    assert description["ingress"] == "Ingress"
    by_name = {d["name"]: d for d in description["deployments"]}
    assert [d["name"] for d in description["deployments"]] == ["Ingress", "Model", "tokenizer"]
    assert by_name["Ingress"]["outbound"] == ["Model", "tokenizer"]
    assert by_name["Ingress"]["is_ingress"] is True
    # the alias max_concurrent_queries is reported under its REST name
    assert by_name["Ingress"]["options"] == {
        "max_ongoing_requests": 5,
        "health_check_period_s": 2.5,
    }
    assert by_name["Model"]["options"] == {
        "num_replicas": 3,
        "ray_actor_options": {"num_cpus": 0.5},
        "route_prefix": "/model",
    }
    assert by_name["tokenizer"] == {
        "name": "tokenizer",
        "options": {},
        "is_function": True,
        "outbound": [],
        "is_ingress": False,
    }


@pytest.mark.parametrize("attr", ["ks_echo_app:unbound", "ks_echo_app:not_an_app"])
def test_attr_must_be_a_bound_application(attr: str) -> None:
    with pytest.raises(BuildError, match=r"must point to a bound application \(call \.bind\(\)\)"):
        describe(attr)


def test_main_prints_the_description() -> None:
    code, document, _ = run_build("ks_composed_app:app")
    assert code == 0
    assert document == describe("ks_composed_app:app")


def test_main_reports_an_import_error() -> None:
    code, document, _ = run_build("ks_broken_import:app")
    assert code == 1
    assert "ModuleNotFoundError: No module named 'kubeserve_no_such_module'" in document["error"]
    assert "ks_broken_import.py" in document["error"]  # the user's frame is shown


def test_main_reports_a_plain_deployment() -> None:
    code, document, _ = run_build("ks_echo_app:unbound")
    assert code == 1
    assert "must point to a bound application (call .bind())" in document["error"]


def test_main_reports_a_missing_module_and_attribute() -> None:
    assert "No module named 'ks_nowhere'" in run_build("ks_nowhere:app")[1]["error"]
    assert "has no attribute 'nope'" in run_build("ks_echo_app:nope")[1]["error"]
    assert run_build("no_separator")[1]["error"].startswith("import_path 'no_separator'")


def test_main_reports_syntax_errors_and_exceptions_in_the_module(tmp_path: Path) -> None:
    (tmp_path / "ks_tmp_syntax.py").write_text("def broken(:\n    pass\n")
    (tmp_path / "ks_tmp_raises.py").write_text(
        "print('noise on stdout')\n\ndef load():\n    raise RuntimeError('config file missing')\n\n"
        "load()\n"
    )
    code, document, _ = run_build("ks_tmp_syntax:app", tmp_path)
    assert code == 1
    assert "SyntaxError" in document["error"] and "ks_tmp_syntax.py" in document["error"]
    code, document, stderr = run_build("ks_tmp_raises:app", tmp_path)
    assert code == 1
    assert document["error"].startswith("RuntimeError: config file missing")
    assert 'ks_tmp_raises.py", line 4, in load' in document["error"]
    assert "noise on stdout" in stderr  # stdout carries only the JSON document


def test_a_pickled_graph_on_stdin_is_described_without_importing_its_module(
    tmp_path: Path,
) -> None:
    """serve.run's graph: the build reads it from stdin; the script that made it, which calls
    serve.run at its top level, is neither importable nor imported there."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys\n"
        "from kubeserve import deployment\n"
        "from kubeserve.sdk.pickled_application import pickle_application\n"
        "@deployment(num_replicas=2)\n"
        "class Model:\n"
        "    pass\n"
        "@deployment\n"
        "class Front:\n"
        "    def __init__(self, model): self.model = model\n"
        "sys.stdout.buffer.write(pickle_application(Front.bind(Model.bind())))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    graph = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, timeout=60, check=True
    ).stdout
    proc = subprocess.run(
        [sys.executable, "-m", "kubeserve.runtime.build", "--pickled"],
        input=graph,
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    description = json.loads(proc.stdout)
    assert [d["name"] for d in description["deployments"]] == ["Front", "Model"]
    assert description["deployments"][1]["options"] == {"num_replicas": 2}


def test_the_build_needs_an_import_path_or_a_pickled_graph() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubeserve.runtime.build", "a:b", "--pickled"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "operator")},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and b"give an import path, or --pickled" in proc.stderr


def test_the_build_fails_on_a_tracing_exporter_that_does_not_import_where_the_app_runs() -> None:
    """The build imports the application where its replicas run (its runtime_env applied): the
    exporter of ``tracing_config`` is looked up there too, so a bad one fails the application
    (DEPLOY_FAILED with this reason) instead of its pods or processes later."""

    def build(exporter: str) -> tuple[int, Any, str]:
        config = {"enabled": True, "exporter_import_path": exporter, "sampling_ratio": 1.0}
        return run_build("ks_echo_app:app", options=("--tracing-config", json.dumps(config)))

    code, document, _ = build("ks_tracing_exporter:exporter")
    assert code == 0 and "deployments" in document
    for exporter, words in [
        ("ks_tracing_exporter:no_such_function", "has no attribute 'no_such_function'"),
        ("ks_nowhere_exporter:exporter", "does not import"),
    ]:
        code, document, _ = build(exporter)
        assert code == 1
        assert document["error"].startswith("tracing_config.exporter_import_path: "), document
        assert exporter in document["error"] and words in document["error"], document
