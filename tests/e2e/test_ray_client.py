"""The real ``serve`` command-line client of Ray 2.60 against kubeserve.

``make test`` installs ``ray[serve]==2.60.0`` into its own virtualenv and names its ``serve``
executable in ``KUBESERVE_RAY_SERVE``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support import ray_cli
from support.common import http, pid_alive, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.ray_cli import needs_ray_serve

pytestmark = needs_ray_serve


def run_serve(
    ks: Kubeserve, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return ray_cli.run_serve(ks.api, *args, env=env)


def serve(ks: Kubeserve, *args: str, env: dict[str, str] | None = None) -> str:
    return ray_cli.serve(ks.api, *args, env=env)


def hello_config_file(ks: Kubeserve, tmp_path: Path) -> Path:
    """A serve config file deploying ``examples.hello`` at ``/hello`` on ``ks``'s proxy port."""
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": ks.proxy_port},
        "applications": [
            {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"}
        ],
    }
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


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


TOKEN = "ray-user-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    with running_kubeserve(tmp_path_factory.mktemp("secured"), token=TOKEN) as server:
        yield server


def test_ray_serve_cli_with_token_auth(secured: Kubeserve, tmp_path: Path) -> None:
    """A Ray user configures the token as for a Ray cluster with token authentication:
    RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, as here for deploy)."""
    ks = secured
    token_file = tmp_path / "auth_token"
    token_file.write_text(TOKEN)
    by_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    by_path = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    path = hello_config_file(ks, tmp_path)

    refused = run_serve(ks, "deploy", str(path))
    assert refused.returncode != 0
    assert "Authentication required" in refused.stderr
    wrong = run_serve(ks, "status", env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "nope"})
    assert wrong.returncode != 0
    assert "Authentication failed" in wrong.stderr

    serve(ks, "deploy", str(path), env=by_path)
    ks.wait_app("hello")
    status = yaml.safe_load(serve(ks, "status", env=by_env))
    assert status["applications"]["hello"]["status"] == "RUNNING"
    (config_out,) = yaml.safe_load_all(serve(ks, "config", env=by_env))
    assert config_out["import_path"] == "examples.hello:app"
    pids = ks.all_pids()
    serve(ks, "shutdown", "-y", env=by_env)
    wait_for(lambda: not ks.details()["applications"], 60, what="shutdown")
    wait_for(lambda: not any(pid_alive(p) for p in pids), 60, what="processes to exit")


def test_ray_serve_cli_deploys_a_ray_fastapi_app_and_a_builder_with_args(
    kubeserve: Kubeserve, tmp_path: Path
) -> None:
    ks = kubeserve
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": ks.proxy_port},
        "applications": [
            {"name": "api", "route_prefix": "/api", "import_path": "ray_fastapi_app:fastapi_app"},
            {
                "name": "built",
                "route_prefix": "/built",
                "import_path": "ray_builder_app:app_builder",
                "args": {"message": "from the serve CLI"},
            },
        ],
    }
    path = tmp_path / "ray-apps.yaml"
    path.write_text(yaml.safe_dump(config))
    serve(ks, "deploy", str(path))
    try:
        ks.wait_app("api", timeout_s=120)
        ks.wait_app("built", timeout_s=120)
        assert http("GET", f"{ks.proxy}/api/items/3?q=x")[1]["item_id"] == 3
        assert http("GET", f"{ks.proxy}/built")[1]["message"] == "from the serve CLI"
        assert "RUNNING" in serve(ks, "status")
    finally:
        serve(ks, "shutdown", "-y")
        wait_for(lambda: not ks.details()["applications"], 60, what="the shutdown")


def test_namespace_default_addresses_the_one_instance_of_kubeserve_start(
    clean_kubeserve: Kubeserve, tmp_path: Path
) -> None:
    """``kubeserve start`` has one instance: the bare paths and ``/namespaces/default/`` address it
    (a script written for a cluster's ``default`` namespace runs unchanged); another namespace is
    a 404 saying so, a name that is no namespace a 400."""
    ks = clean_kubeserve
    path = hello_config_file(ks, tmp_path)
    default = f"{ks.api}/namespaces/default"
    ray_cli.serve(default, "deploy", str(path))
    ks.wait_app("hello")  # read through the bare paths
    status = yaml.safe_load(ray_cli.serve(default, "status"))
    assert status["applications"]["hello"]["status"] == "RUNNING"
    aliased = http("GET", f"{default}/api/serve/applications/")[1]
    assert aliased["applications"] == ks.details()["applications"]

    assert http("GET", f"{ks.api}/namespaces/team-a/api/serve/applications/") == (
        404,
        {
            "error": 'no namespace "team-a" here: this server has one serving instance, addressed '
            'by the bare paths (/api/...) or as namespace "default" (/namespaces/default/api/...)',
            "details": [],
        },
    )
    failed = ray_cli.run_serve(f"{ks.api}/namespaces/team-a", "status")
    assert failed.returncode != 0 and "404" in failed.stdout + failed.stderr
    status_code, body = http("GET", f"{ks.api}/namespaces/Team_A/api/ray/version")
    assert status_code == 400
    assert body["error"].startswith("invalid namespace 'Team_A' in the path: a namespace name")
    assert body["details"][0]["loc"] == ["path", "namespace"]
    ray_cli.serve(default, "shutdown", "-y")
    wait_for(lambda: not ks.details()["applications"], 30, what="nothing deployed")
