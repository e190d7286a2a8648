"""``import ray`` in kubeserve's processes: kubeserve's compatibility layer, whatever else is on
the path (a real Ray included), and a clear error for what of Ray is not provided."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator"
APPS = ROOT / "tests" / "apps"


def real_ray_site_packages() -> Path | None:
    """The site-packages of the Ray 2.60 virtualenv the Makefile installs, when present."""
    serve = os.environ.get("KUBESERVE_RAY_SERVE")
    if not serve:
        return None
    found = sorted(Path(serve).resolve().parents[1].glob("lib/python3*/site-packages"))
    return found[0] if found and (found[0] / "ray").is_dir() else None


def run_python(code: str, *path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*path, OPERATOR, APPS))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


PROBE = """
from kubeserve.sdk import ray_namespace
ray_namespace.install()
import json, ray
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator
from ray.serve.config import AutoscalingConfig, HTTPOptions, ProxyLocation
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.schema import ServeDeploySchema
import kubeserve.sdk.handle as ours
errors = {}
try:
    import ray.data
except ModuleNotFoundError as exc:
    errors["ray.data"] = str(exc)
try:
    ray.remote
except AttributeError as exc:
    errors["ray.remote"] = str(exc)
print(json.dumps({
    "ray_file": ray.__file__,
    "same_serve": ray.serve is serve,
    "handle_is_ours": DeploymentHandle is ours.DeploymentHandle,
    "initialized": ray.is_initialized(),
    "autoscaling": AutoscalingConfig(min_replicas=1, max_replicas=4).max_replicas,
    "errors": errors,
}))
"""


def check_probe(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["ray_file"].startswith(str(OPERATOR / "kubeserve" / "compat"))
    assert answer["same_serve"] and answer["handle_is_ours"] and answer["initialized"]
    assert answer["autoscaling"] == 4
    assert "ray.data is part of Ray" in answer["errors"]["ray.data"]
    assert "ray.remote is part of Ray core" in answer["errors"]["ray.remote"]


def test_ray_resolves_to_kubeserve_without_ray_installed() -> None:
    check_probe(run_python(PROBE))


def test_ray_resolves_to_kubeserve_even_with_a_real_ray_first_on_the_path() -> None:
    site = real_ray_site_packages()
    if site is None:
        pytest.skip("the Ray 2.60 virtualenv is not installed (make ray-client)")
    check_probe(run_python(PROBE, site))


def test_without_the_finder_there_is_no_ray() -> None:
    result = run_python("import ray")
    assert result.returncode != 0 and "No module named 'ray'" in result.stderr


def test_the_build_process_imports_a_ray_serve_application() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(OPERATOR), str(APPS)]))
    result = subprocess.run(
        [sys.executable, "-m", "kubeserve.cli", "build", "ray_composition_app:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    graph = json.loads(result.stdout)
    assert graph["ingress"] == "Ingress"
    assert [d["name"] for d in graph["deployments"]] == [
        "Ingress",
        "Adder",
        "Multiplier",
        "Streamer",
    ]


def test_install_refuses_when_another_ray_is_already_imported() -> None:
    code = (
        "import sys, types; sys.modules['ray'] = types.ModuleType('ray')\n"
        "from kubeserve.sdk import ray_namespace\n"
        "try:\n    ray_namespace.install()\nexcept RuntimeError as e:\n    print(e)\n"
    )
    result = run_python(code)
    assert "real Ray is already imported" in result.stdout, result.stderr


def test_a_ray_serve_application_does_not_load_the_driver_api_until_it_is_used() -> None:
    """A replica imports ``ray.serve`` for the decorator; the driver (its admin client, its
    handle client) loads only when a script first touches ``serve.run`` and its kin."""
    code = (
        "import sys\n"
        "from kubeserve.sdk import ray_namespace\n"
        "ray_namespace.install()\n"
        "from ray import serve\n"
        "@serve.deployment(num_replicas=2)\n"
        "class D:\n    pass\n"
        "app = D.bind()\n"
        "DRIVER = 'kubeserve.compat.ray.serve.driver'\n"
        "print(DRIVER in sys.modules)\n"
        "run = serve.run\n"
        "print(DRIVER in sys.modules, run is sys.modules[DRIVER].run)\n"
    )
    result = run_python(code)
    assert result.stdout.split("\n")[:2] == ["False", "True True"], result.stderr
