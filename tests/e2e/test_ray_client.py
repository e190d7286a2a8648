"""The real ``serve`` command-line client of Ray 2.60 against kubeserve.

``make test`` installs ``ray[serve]==2.60.0`` into its own virtualenv and names its ``serve``
executable in ``KUBESERVE_RAY_SERVE``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kubeserve_testing import Kubeserve, pid_alive, wait_for

RAY_SERVE = os.environ.get("KUBESERVE_RAY_SERVE", "")

pytestmark = pytest.mark.skipif(
    not RAY_SERVE or not Path(RAY_SERVE).exists(),
    reason="the Ray 2.60 serve client is installed by `make test` (KUBESERVE_RAY_SERVE)",
)


def serve(ks: Kubeserve, *args: str) -> str:
    result = subprocess.run(
        [RAY_SERVE, *args, "-a", ks.api],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert result.returncode == 0, (
        f"serve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def test_ray_serve_cli_deploy_status_config_shutdown(kubeserve: Kubeserve, tmp_path: Path) -> None:
    ks = kubeserve
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": ks.proxy_port},
        "applications": [
            {
                "name": "composed",
                "route_prefix": "/",
                "import_path": "examples.composed:app",
                "deployments": [{"name": "Greeter", "user_config": {"greeting": "Hi"}}],
            },
            {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"},
        ],
    }
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))

    serve(ks, "deploy", str(path))
    ks.wait_app("composed")
    ks.wait_app("hello")

    status = yaml.safe_load(serve(ks, "status"))
    assert status["applications"]["composed"]["status"] == "RUNNING"
    assert status["applications"]["composed"]["deployments"]["Greeter"]["status"] == "HEALTHY"
    assert status["applications"]["hello"]["status"] == "RUNNING"

    configs = list(yaml.safe_load_all(serve(ks, "config")))
    by_name = {c["name"]: c for c in configs}
    assert by_name["composed"]["import_path"] == "examples.composed:app"
    assert by_name["composed"]["deployments"] == [
        {"name": "Greeter", "user_config": {"greeting": "Hi"}}
    ]
    assert by_name["hello"]["route_prefix"] == "/hello"

    pids = ks.all_pids()
    serve(ks, "shutdown", "-y")
    wait_for(lambda: not ks.details()["applications"], 60, what="shutdown")
    wait_for(lambda: not any(pid_alive(p) for p in pids), 60, what="processes to exit")
