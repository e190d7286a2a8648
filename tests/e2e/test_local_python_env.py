"""runtime_env ``pip`` / ``uv`` on ``kubeserve start``: packages installed with uv from the index
this machine is configured for (PyPI), one environment per distinct spec shared by every
application asking for it, removed once nothing uses it.

The package is ``inflection`` (one pure-Python module, no dependencies), absent from kubeserve's
own environment; the failure case asks for a name no index has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.zip_server import serving, write_zip

PACKAGE = "inflection==0.5.1"
APP = (
    "import inflection\n"
    "from kubeserve import deployment\n"
    "@deployment\n"
    "def camel(request):\n"
    "    import kubeserve\n"
    "    return {'camel': inflection.camelize('hello_world'), 'file': inflection.__file__}\n"
    "app = camel.bind()\n"
)


@pytest.fixture(scope="module")
def kubeserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    # environments go as soon as nothing uses them, so that the test can see it happen
    state = tmp_path_factory.mktemp("kubeserve")
    with running_kubeserve(state, args=("--runtime-env-keep-s", "0")) as server:
        yield server


@pytest.fixture
def ks(kubeserve: Kubeserve) -> Iterator[Kubeserve]:
    yield kubeserve
    kubeserve.shutdown()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A working_dir archive with the app and a requirements file, served over HTTP."""
    root = tmp_path_factory.mktemp("zips")
    write_zip(
        root / "project.zip",
        {"project/camel_app.py": APP, "project/requirements.txt": f"# pinned\n{PACKAGE}\n"},
    )
    with serving(root) as base:
        yield f"{base}project.zip"


def _app(name: str, project: str, **runtime_env: Any) -> dict[str, Any]:
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "import_path": "camel_app:app",
        "runtime_env": {"working_dir": project, **runtime_env},
    }


def _envs_dir(ks: Kubeserve) -> Path:
    return ks.state_dir / "runtime_env_cache" / "python"


def test_pip_packages_are_importable_and_one_environment_is_shared(
    ks: Kubeserve, project: str
) -> None:
    ks.put([_app("a", project, pip=[PACKAGE]), _app("b", project, pip={"packages": [PACKAGE]})])
    ks.wait_app("a", timeout_s=120)
    ks.wait_app("b", timeout_s=120)
    answers = [http("GET", f"{ks.proxy}/{name}")[1] for name in ("a", "b")]
    assert answers[0]["camel"] == "HelloWorld"
    # the list and the dict form are one spec: one environment, under the state directory
    assert answers[0]["file"] == answers[1]["file"], answers
    assert Path(answers[0]["file"]).is_relative_to(_envs_dir(ks))
    assert len(list(_envs_dir(ks).iterdir())) == 1


def test_a_requirements_file_of_the_working_dir_with_uv_and_the_message_while_installing(
    ks: Kubeserve, project: str
) -> None:
    # uv_check makes this spec distinct from any other test's: its install is seen from the start
    ks.put([_app("u", project, uv={"packages": ["-r requirements.txt"], "uv_check": True})])
    messages: set[str] = set()

    def running() -> bool:
        app = ks.app("u")
        if app is not None:
            messages.add(app.get("message", ""))
        return app is not None and app["status"] == "RUNNING"

    wait_for(running, timeout_s=120, interval_s=0.02)
    assert any("installing the packages of runtime_env.uv" in m for m in messages), messages
    assert http("GET", f"{ks.proxy}/u")[1]["camel"] == "HelloWorld"


def test_an_installer_failure_is_deploy_failed_with_its_last_lines(
    ks: Kubeserve, project: str
) -> None:
    ks.put([_app("bad", project, pip=["kubeserve-no-such-package-a8f3"])])
    app = ks.wait_app("bad", "DEPLOY_FAILED", timeout_s=120)
    assert "kubeserve-no-such-package-a8f3" in app["message"], app
    assert "uv" in app["message"] and "exit code" in app["message"], app
    assert not any(_envs_dir(ks).glob("*.tmp-*"))  # nothing half-built is left


def test_a_deployment_level_pip_override(ks: Kubeserve, project: str) -> None:
    app = _app("d", project)
    actor_env = {"pip": [PACKAGE], "env_vars": {"X": "1"}}
    app["deployments"] = [{"name": "camel", "ray_actor_options": {"runtime_env": actor_env}}]
    # the build itself imports camel_app, so the application's own env needs it as well
    app["runtime_env"]["pip"] = [PACKAGE]
    ks.put([app])
    ks.wait_app("d", timeout_s=120)
    assert http("GET", f"{ks.proxy}/d")[1]["camel"] == "HelloWorld"


def test_a_deployment_level_installer_failure_is_deploy_failed(ks: Kubeserve, project: str) -> None:
    app = _app("dbad", project, pip=[PACKAGE])  # the build imports camel_app: it needs the package
    bogus = {"pip": ["kubeserve-no-such-package-b7e1"]}
    app["deployments"] = [{"name": "camel", "ray_actor_options": {"runtime_env": bogus}}]
    ks.put([app])
    failed = ks.wait_app("dbad", "DEPLOY_FAILED", timeout_s=120)
    assert "runtime_env of deployment 'camel'" in failed["message"], failed
    assert "kubeserve-no-such-package-b7e1" in failed["message"], failed


def test_an_environment_nothing_uses_is_removed(ks: Kubeserve, project: str) -> None:
    ks.put([_app("gc", project, pip={"packages": [PACKAGE], "pip_check": True})])
    ks.wait_app("gc", timeout_s=120)
    used = Path(http("GET", f"{ks.proxy}/gc")[1]["file"])
    env_dir = next(p for p in used.parents if p.parent == _envs_dir(ks))  # <envs>/<key>/site/...
    ks.shutdown()  # deletes the application; its replica stops
    wait_for(lambda: not env_dir.exists(), timeout_s=30)
    # deployed again: rebuilt from uv's cache (hard links, no download), as quick as a warm start
    started = time.monotonic()
    ks.put([_app("gc", project, pip={"packages": [PACKAGE], "pip_check": True})])
    ks.wait_app("gc", timeout_s=120)
    assert time.monotonic() - started < 30


def test_the_init_container_command_lays_out_the_packages_for_the_pod(
    tmp_path: Path, project: str
) -> None:
    """What a pod's ``runtime-env`` init container runs (rendered by render_pod), run here: the
    main container's PYTHONPATH entries then import the package."""
    dest = tmp_path / "runtime-env"
    env = {**os.environ, "UV_CACHE_DIR": str(dest / ".uv-cache")}
    packages = json.dumps({"pip": "requirements.txt"})
    command = [sys.executable, "-m", "kubeserve.cli", "fetch-runtime-env", "--dest", str(dest)]
    command += ["--working-dir", project, "--packages", packages]
    subprocess.run(command, env=env, check=True, timeout=120)
    python_path = f"{dest}/working_dir:{dest}/python"
    probe = "import camel_app, inflection; print(inflection.camelize('a_b'))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "AB"
    # a failure exits non-zero with the installer's tail: the termination message on Kubernetes
    bad = json.dumps({"uv": ["kubeserve-no-such-package-a8f3"]})
    failed = subprocess.run(
        [*command[:6], "--packages", bad], env=env, capture_output=True, text=True, check=False
    )
    assert failed.returncode == 1
    assert "kubeserve-no-such-package-a8f3" in failed.stderr
