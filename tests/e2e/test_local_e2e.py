"""End to end on one machine: a real ``kubeserve start``, real replica processes, real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from support.common import http, pid_alive, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.zip_server import serving, write_zip

COMPOSED = {"name": "composed", "route_prefix": "/", "import_path": "examples.composed:app"}


def greeting_config(greeting: str, replicas: int = 1) -> dict[str, object]:
    return {
        **COMPOSED,
        "deployments": [
            {"name": "Greeter", "num_replicas": replicas, "user_config": {"greeting": greeting}}
        ],
    }


def test_composed_app_serves_traffic_through_the_proxy(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    status, body = ks.put([greeting_config("Hello")])
    assert status == 200, body
    app = ks.wait_app("composed")
    assert set(app["deployments"]) == {"Frontend", "Greeter"}
    assert all(d["status"] == "HEALTHY" for d in app["deployments"].values())
    status, answer = http("POST", f"{ks.proxy}/", {"name": "Ada"})
    assert status == 200
    assert answer["message"] == "Hello, Ada!"
    assert answer["greeter_pid"] in ks.replica_pids("composed", "Greeter")
    assert http("GET", f"{ks.proxy}/-/routes")[1] == {"/": "composed"}
    controller_log = Path(ks.details()["controller_info"]["log_file_path"])
    assert controller_log.parent == ks.state_dir / "logs"
    assert "kubeserve." in controller_log.read_text()  # the controller's own records
    assert controller_log.stat().st_mode & 0o077 == 0


def test_user_config_change_is_applied_without_restarting_replicas(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    ks.put([greeting_config("Hello", replicas=2)])
    ks.wait_app("composed")
    before = ks.replica_pids("composed", "Greeter") + ks.replica_pids("composed", "Frontend")

    assert ks.put([greeting_config("Bonjour", replicas=2)])[0] == 200

    def answers_bonjour() -> bool:
        return all(
            http("GET", f"{ks.proxy}/?name=Ada")[1]["message"] == "Bonjour, Ada!" for _ in range(6)
        )

    wait_for(answers_bonjour, 30, what="the new greeting")
    ks.wait_app("composed")
    after = ks.replica_pids("composed", "Greeter") + ks.replica_pids("composed", "Frontend")
    assert after == before


def test_scale_up_and_down(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    for replicas in (1, 3, 1):
        ks.put([greeting_config("Hello", replicas=replicas)])

        def scaled(n: int = replicas) -> bool:
            app = ks.app("composed")
            # while the new config is taken, a reading may not list Greeter (or its replicas) yet
            greeter = (app or {}).get("deployments", {}).get("Greeter", {})
            return (
                app is not None
                and app["status"] == "RUNNING"
                and len(greeter.get("replicas", ())) == n
                and len(ks.replica_pids("composed", "Greeter")) == n
            )

        wait_for(scaled, 60, what=f"{replicas} Greeter replicas")
        pids = {http("GET", f"{ks.proxy}/")[1]["greeter_pid"] for _ in range(12)}
        assert pids <= set(ks.replica_pids("composed", "Greeter"))
        if replicas == 3:
            assert len(pids) >= 2  # the router spreads calls over the replicas


def test_a_killed_replica_is_replaced_and_status_recovers(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([greeting_config("Hello")])
    ks.wait_app("composed")
    (victim,) = ks.replica_pids("composed", "Greeter")
    os.kill(victim, signal.SIGKILL)
    ks.wait_replaced("composed", "Greeter", victim)
    ks.wait_app("composed")
    assert http("GET", f"{ks.proxy}/?name=again")[1]["message"] == "Hello, again!"


def test_a_broken_import_is_deploy_failed_with_the_error(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([{"name": "broken", "route_prefix": "/b", "import_path": "ks_broken_import:app"}])
    app = ks.wait_app("broken", "DEPLOY_FAILED")
    assert "ModuleNotFoundError" in app["message"] or "ImportError" in app["message"], app
    ks.wait_proxy()
    status, body = http("GET", f"{ks.proxy}/b")
    assert status == 404, body  # a failed application has no route


def test_a_constructor_error_is_deploy_failed_with_the_error(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([{"name": "ctor", "route_prefix": "/c", "import_path": "ks_ctor_error:app"}])
    app = ks.wait_app("ctor", "DEPLOY_FAILED", timeout_s=90)
    assert "constructor refused to start" in app["message"], app
    # A request is answered at once, naming the application's state, instead of waiting for a
    # replica that is not coming until the client gives up.
    ks.wait_proxy()
    started = time.monotonic()
    try:
        urllib.request.urlopen(f"{ks.proxy}/c", timeout=5)
        raise AssertionError("a failed application answered")
    except urllib.error.HTTPError as err:
        status, retry_after, body = err.code, err.headers["Retry-After"], err.read().decode()
    assert time.monotonic() - started < 2
    assert (status, retry_after) == (503, "10"), body
    assert "application 'ctor' is DEPLOY_FAILED" in body
    assert "constructor refused" not in body  # the error's text is the admin API's to show


def test_health_check_failure_marks_unhealthy_and_replaces_the_replica(
    clean_kubeserve: Kubeserve, tmp_path: Path
) -> None:
    ks = clean_kubeserve
    flag = tmp_path / "unhealthy"
    ks.put(
        [
            {
                "name": "probe",
                "route_prefix": "/probe",
                "import_path": "e2e_probe:app",
                "runtime_env": {"env_vars": {"KS_HEALTH_FILE": str(flag)}},
            }
        ]
    )
    ks.wait_app("probe")
    (first,) = ks.replica_pids("probe", "Probe")
    flag.touch()
    app = ks.wait_app("probe", "UNHEALTHY", timeout_s=30)
    assert app["deployments"]["Probe"]["status"] == "UNHEALTHY"
    assert "health check" in app["deployments"]["Probe"]["message"]
    # replaced only after Ray's three consecutive failures, the first two only logged
    controller_log = (ks.state_dir / "logs" / "controller.log").read_text()
    assert "failed health check 1 of 3 in a row" in controller_log
    assert "failed health check 2 of 3 in a row" in controller_log
    flag.unlink()
    ks.wait_app("probe", timeout_s=60)
    (second,) = ks.replica_pids("probe", "Probe")
    assert second != first
    assert not pid_alive(first)


def test_a_blocking_sync_handler_stalls_neither_other_requests_nor_health_checks(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    ks.put([{"name": "blocking", "route_prefix": "/b", "import_path": "ks_blocking_app:app"}])
    ks.wait_app("blocking")
    (pid,) = ks.replica_pids("blocking", "Blocking")
    slow: list[tuple[int, object]] = []
    thread = threading.Thread(target=lambda: slow.append(http("GET", f"{ks.proxy}/b?sleep=6")))
    thread.start()
    wait_for(
        lambda: http("GET", f"{ks.proxy}/b?sleeping")[1] == "1", 10, what="slow request in handler"
    )
    assert http("GET", f"{ks.proxy}/b?sleep=0") == (200, "slept 0")
    assert thread.is_alive(), "the fast request waited for the slow one"
    while thread.is_alive():  # health checks run every 0.2 s meanwhile, each with 1 s to answer
        assert ks.app("blocking")["deployments"]["Blocking"]["status"] == "HEALTHY"
        thread.join(0.5)
    assert slow == [(200, "slept 6")]
    assert ks.replica_pids("blocking", "Blocking") == [pid]


def test_env_vars_app_level_overridden_per_deployment(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put(
        [
            {
                "name": "probe",
                "route_prefix": "/probe",
                "import_path": "e2e_probe:app",
                "runtime_env": {"env_vars": {"KS_A": "app", "KS_B": "app"}},
                "deployments": [
                    {
                        "name": "Probe",
                        "ray_actor_options": {"runtime_env": {"env_vars": {"KS_B": "deployment"}}},
                    }
                ],
            }
        ]
    )
    ks.wait_app("probe")
    env = http("GET", f"{ks.proxy}/probe")[1]["env"]
    assert env["KS_A"] == "app"
    assert env["KS_B"] == "deployment"


def test_working_dir_is_fetched_from_a_zip_uri(clean_kubeserve: Kubeserve, tmp_path: Path) -> None:
    ks = clean_kubeserve
    app = (
        "from kubeserve import deployment\n"
        "@deployment\n"
        "def hello(request):\n"
        "    return 'hello from a zip'\n"
        "app = hello.bind()\n"
    )
    write_zip(tmp_path / "project.zip", {"project/remote_app.py": app})
    with serving(tmp_path) as base:
        ks.put(
            [
                {
                    "name": "remote",
                    "route_prefix": "/remote",
                    "import_path": "remote_app:app",
                    "runtime_env": {"working_dir": f"{base}project.zip"},
                }
            ]
        )
        ks.wait_app("remote")
        assert http("GET", f"{ks.proxy}/remote")[1] == "hello from a zip"


def test_delete_stops_every_process(kubeserve: Kubeserve) -> None:
    ks = kubeserve
    ks.put([greeting_config("Hello", replicas=2)])
    ks.wait_app("composed")
    pids = ks.all_pids()
    assert len(pids) == 4  # two Greeters, one Frontend, the proxy
    ks.shutdown()
    assert not any(pid_alive(p) for p in pids)
    assert ks.details() == {
        "controller_info": {},
        "proxies": {},
        "applications": {},
        "target_capacity": None,
    }
    assert http("DELETE", f"{ks.api}/api/serve/applications/")[0] == 200  # nothing runs: a no-op


def test_applications_come_back_after_a_restart(tmp_path: Path) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        ks.put([greeting_config("Persisted")])
        ks.wait_app("composed")
        old = ks.all_pids()
        assert ks.stop() == 0  # a clean, graceful exit on SIGTERM
        assert not any(pid_alive(p) for p in old)
        ks.start()
        ks.wait_app("composed")
        assert http("GET", f"{ks.proxy}/?name=x")[1]["message"] == "Persisted, x!"
        ks.shutdown()


def test_scale_down_lets_in_flight_requests_finish(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    probe = {"name": "probe", "route_prefix": "/probe", "import_path": "e2e_probe:app"}
    two = {**probe, "deployments": [{"name": "Probe", "num_replicas": 2}]}
    ks.put([two])
    ks.wait_app("probe")
    results: list[tuple[int, object]] = []
    slow = [
        threading.Thread(target=lambda: results.append(http("GET", f"{ks.proxy}/probe/slow?s=1.5")))
        for _ in range(2)
    ]
    for thread in slow:
        thread.start()
    wait_for(
        lambda: (
            sum(
                _metric(ks, pid, "kubeserve_replica_ongoing_requests")
                for pid in ks.replica_pids("probe", "Probe")
            )
            >= 2
        ),
        10,
        what="both slow requests in flight",
    )
    ks.put([{**probe, "deployments": [{"name": "Probe", "num_replicas": 1}]}])
    for thread in slow:
        thread.join(30)
    assert [status for status, _ in results] == [200, 200], results
    wait_for(lambda: len(ks.replica_pids("probe", "Probe")) == 1, 30, what="scale down to 1")


def _metric(ks: Kubeserve, pid: int, name: str) -> float:
    """A replica's own Prometheus metric, read from its port (found in its command line)."""
    text = ks.replica_request(pid, "GET", "/-/metrics")[1].decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_kubeserve_client_commands(clean_kubeserve: Kubeserve, tmp_path: Path) -> None:
    ks = clean_kubeserve
    config = tmp_path / "config.yaml"
    config.write_text(
        "proxy_location: HeadOnly\n"
        f"http_options: {{host: 127.0.0.1, port: {ks.proxy_port}}}\n"
        "applications:\n"
        "  - {name: hello, route_prefix: /hello, import_path: 'examples.hello:app'}\n"
        "  - {name: talker, route_prefix: /talk, import_path: 'ks_talker_app:app'}\n"
    )

    def kubeserve(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "kubeserve.cli", *args, "--address", ks.api],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == code, result.stderr
        return result

    progress = kubeserve("deploy", str(config), "--wait").stdout
    assert "hello: RUNNING  Hello 1/1 HEALTHY" in progress.splitlines()
    assert "talker: RUNNING  Talker 1/1 HEALTHY" in progress.splitlines()
    status = yaml.safe_load(kubeserve("status").stdout)
    assert status["applications"]["hello"]["status"] == "RUNNING"
    configs = list(yaml.safe_load_all(kubeserve("config").stdout))
    assert {c["import_path"] for c in configs} == {"examples.hello:app", "ks_talker_app:app"}

    # logs: every replica's file, each line labelled with its deployment and replica
    assert http("GET", f"{ks.proxy}/talk?word=xyzzy")[0] == 200
    (talker,) = [r["replica_id"] for r in ks.app("talker")["deployments"]["Talker"]["replicas"]]
    assert f"[Talker {talker}] heard xyzzy" in kubeserve("logs", "talker").stdout.splitlines()
    assert "no deployment 'Nope'" in kubeserve("logs", "talker", "Nope", code=1).stderr
    follow = subprocess.Popen(
        [sys.executable, "-m", "kubeserve.cli", "logs", "talker", "-f", "--address", ks.api],
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, follow.kill)  # a missing line ends readline with EOF
    watchdog.start()

    def read_until(text: str) -> str:
        assert follow.stdout is not None
        while line := follow.stdout.readline():
            if text in line:
                return line
        raise AssertionError(f"logs --follow ended before {text!r}")

    try:
        read_until("heard xyzzy")
        assert http("GET", f"{ks.proxy}/talk?word=plugh")[0] == 200
        assert read_until("heard plugh") == f"[Talker {talker}] heard plugh\n"
    finally:
        watchdog.cancel()
        follow.kill()
        follow.wait()

    # a failing deploy: --wait exits 1 with the error; a bad file is a 400 with the field
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        f"http_options: {{host: 127.0.0.1, port: {ks.proxy_port}}}\n"
        "applications: [{name: b, route_prefix: /b, import_path: 'ks_broken_import:app'}]\n"
    )
    failed = kubeserve("deploy", str(broken), "--wait", "--timeout", "120", code=1)
    assert "b: DEPLOY_FAILED" in failed.stdout
    assert "kubeserve_no_such_module" in failed.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [{name: x, import_path: 'nodots'}]\n")
    assert "applications.0.import_path" in kubeserve("deploy", str(bad), code=1).stderr
