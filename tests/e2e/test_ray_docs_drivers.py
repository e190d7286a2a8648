"""Driver scripts in the patterns of Ray Serve's documentation (``tests/drivers/ray_docs/``), run
unchanged against one ``kubeserve start``, both ways the README documents:
``python -m kubeserve.compat FILE``, and ``python FILE`` with kubeserve's ``ray`` on
``PYTHONPATH`` (``python -m kubeserve.compat --pythonpath``).

The scripts send their requests to ``http://localhost:8000`` as the documentation does; the
instance's proxy listens on a free port of its own, and the standard ``http_proxy`` variable
points ``requests`` at it (absolute-form targets, which it accepts as any HTTP server must).
The admin API and the handles' connections are addressed by IP, which ``no_proxy`` leaves out.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.ray_docs import DOCS, WAYS, driver_command

TOKEN = "ray-docs-test-token"


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve-ray-docs"), token=TOKEN) as ks:
        yield ks


def driver_env(ks: Kubeserve, env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "KUBESERVE_ADDRESS": ks.api,
        "KUBESERVE_AUTH_TOKEN": TOKEN,
        "KUBESERVE_STATE_DIR": str(ks.state_dir),
        "http_proxy": ks.proxy,
        "no_proxy": "127.0.0.1",
    }


def run_docs_driver(ks: Kubeserve, name: str, way: str, cwd: Path) -> str:
    """Run ``tests/drivers/ray_docs/<name>`` from another folder; its output (it must exit 0)."""
    command, env = driver_command(DOCS / name, way)
    result = subprocess.run(
        command, cwd=cwd, env=driver_env(ks, env), capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr + ks.log()
    return result.stdout


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    ("script", "printed"),
    [
        ("getting_started.py", "bon matin"),
        ("key_concepts.py", "Hello Corey!"),
        ("model_composition.py", ""),
        ("http_guide.py", ""),
        ("streaming.py", "Client disconnecting"),
        ("batching.py", ""),
        ("multiplexing.py", ""),
        ("autoscaling.py", "HEALTHY"),
        ("driver_api.py", "caught RayTaskError: RayTaskError(ValueError)"),
    ],
)
def test_a_documentation_pattern_runs_unchanged(
    ks: Kubeserve, tmp_path: Path, script: str, printed: str, way: str
) -> None:
    assert printed in run_docs_driver(ks, script, way, tmp_path)


def test_a_deployments_error_is_caught_as_its_own_type_and_as_ray_task_error(
    ks: Kubeserve, tmp_path: Path
) -> None:
    out = run_docs_driver(ks, "driver_api.py", "compat", tmp_path)
    assert "caught ValueError" in out and "caught RayTaskError" in out
    # a call its caller cancelled: Ray's RequestCancelledError, as in local testing mode
    assert "caught RequestCancelledError: Request was cancelled." in out


def scrape(ks: Kubeserve) -> list[tuple[str, dict[str, str], float]]:
    status, text = http("GET", f"{ks.api}/metrics", headers=ks.headers)
    assert status == 200, text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


@pytest.mark.parametrize("way", WAYS)
def test_custom_metrics_reach_the_instances_prometheus_output(
    ks: Kubeserve, tmp_path: Path, way: str
) -> None:
    """Recorded as Ray records them: the user's tags and the deployment, replica, application."""
    run_docs_driver(ks, "custom_metrics.py", way, tmp_path)
    replicas = {
        r["replica_id"] for r in ks.wait_app("metered")["deployments"]["MyDeployment"]["replicas"]
    }

    def mine(name: str) -> list[tuple[dict[str, str], float]]:
        return [
            (labels, v)
            for sample, labels, v in scrape(ks)
            if sample == name and labels.get("replica") in replicas
        ]

    counted = wait_for(
        lambda: [s for s in mine("ray_my_counter_total") if s[1] == 3], 30, what="my_counter"
    )
    ((labels, _),) = counted
    assert labels["model"] == "123" and labels["application"] == "metered"
    assert labels["deployment"] == "MyDeployment"
    assert [v for _, v in mine("ray_my_gauge")] == [5]
    assert sum(v for _, v in mine("ray_my_histogram_count")) == 5


def test_a_blocking_run_serves_until_interrupted_and_the_application_stays(
    ks: Kubeserve, tmp_path: Path
) -> None:
    """As Ray's ``serve.run(blocking=True)``: it blocks after deploying; Ctrl-C ends the script
    with ``KeyboardInterrupt``; on kubeserve the instance outlives it: the application runs on."""
    command, env = driver_command(DOCS / "blocking_run.py", "plain")
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=driver_env(ks, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as in a terminal: a test run in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(
            lambda: http("GET", f"{ks.proxy}/blocking") == (200, "still here"),
            90,
            what="the blocking driver's application to answer",
            ignoring=(OSError,),  # the proxy starts with the instance's first application
        )
        assert proc.poll() is None, "serve.run(blocking=True) returned"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
    assert http("GET", f"{ks.proxy}/blocking") == (200, "still here")


def test_documentation_scripts_need_no_kubeserve_name() -> None:
    """They are Ray users' scripts: nothing in them names kubeserve or the test's addresses."""
    for script in DOCS.glob("*.py"):
        text = script.read_text()
        assert "kubeserve" not in text and "environ" not in text, script
        assert "localhost:8000" in text or "requests" not in text, script
