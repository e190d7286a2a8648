"""Logs of ``kubeserve start``: request ids end to end, access lines, Ray's encodings and levels,
rotation. Real proxy, real replicas, their real log files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

ECHO = {"name": "echo", "route_prefix": "/echo", "import_path": "ks_echo_app:app"}
COMPOSED = {
    "name": "composed",
    "route_prefix": "/composed",
    "import_path": "examples.composed:app",
}


def replica_logs(ks: Kubeserve, app: str, deployment: str) -> list[Path]:
    """The log files of ``deployment``'s running replicas (as the GET details point at them)."""
    replicas = ks.details()["applications"][app]["deployments"][deployment]["replicas"]
    return [Path(r["log_file_path"]) for r in replicas if r["state"] == "RUNNING"]


def logged(ks: Kubeserve, app: str, deployment: str) -> str:
    return "".join(p.read_text() for p in replica_logs(ks, app, deployment))


def test_the_callers_request_id_is_answered_and_written_by_the_replica(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    assert ks.put([ECHO])[0] == 200
    ks.wait_app("echo")
    status, _ = http("GET", f"{ks.proxy}/echo/log", headers={"X-Request-Id": "req-1234"})
    assert status == 200

    def request_lines() -> list[str] | None:
        lines = [line for line in logged(ks, "echo", "Echo").splitlines() if " req-1234 " in line]
        # the access line comes with the next batch (every 0.1 s), after the user's own lines
        return lines if any("-- GET /echo 200 " in line for line in lines) else None

    lines = wait_for(request_lines, 10, what="the replica's lines of request req-1234")
    text = "\n".join(lines)
    assert "-- info from user code" in text  # the user's own record names the request
    assert "-- GET /echo 200 " in text  # Ray's access line
    assert "debug from user code" not in text  # INFO by default, as in Ray
    access = next(line for line in lines if "-- GET /echo 200 " in line)
    level, _date, _time, deployment, replica, request_id, *_ = access.split()
    assert (level, deployment, request_id) == ("INFO", "Echo", "req-1234")
    assert replica.startswith("Echo")
    assert http("GET", f"{ks.proxy}/-/healthz")[0] == 200  # a probe: no access line
    (proxy,) = ks.details()["proxies"].values()
    wait_for(
        lambda: any(
            " req-1234 -- GET /echo 200 " in line
            for line in Path(proxy["log_file_path"]).read_text().splitlines()
        ),
        10,
        what="the proxy's access line of request req-1234",
    )
    assert "GET /-/healthz" not in Path(proxy["log_file_path"]).read_text()


def test_a_handle_call_carries_the_request_id_into_the_callee(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([COMPOSED])[0] == 200
    ks.wait_app("composed")
    status, _ = http(
        "POST", f"{ks.proxy}/composed", {"name": "Ada"}, headers={"X-Request-Id": "nested-77"}
    )
    assert status == 200
    wait_for(
        lambda: any(
            " nested-77 " in line and "-- CALL greet OK " in line
            for line in logged(ks, "composed", "Greeter").splitlines()
        ),
        10,
        what="the callee's access line of the call, with the caller's request id",
    )


def test_json_encoding_debug_level_and_no_access_lines(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    config = {
        **ECHO,
        "logging_config": {
            "encoding": "JSON",
            "log_level": "DEBUG",
            "enable_access_log": False,
            "additional_log_standard_attrs": ["name"],
        },
    }
    assert ks.put([config])[0] == 200
    ks.wait_app("echo")
    assert http("GET", f"{ks.proxy}/echo/log", headers={"X-Request-Id": "json-1"})[0] == 200

    def records() -> list[dict[str, Any]]:
        found = []
        for line in logged(ks, "echo", "Echo").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("request_id") == "json-1":
                    found.append(record)
        return found

    mine = wait_for(lambda: len(found := records()) >= 2 and found, 10, what="JSON records")
    messages = {r["message"]: r for r in mine}
    assert set(messages) == {"debug from user code", "info from user code"}  # no access line
    debug = messages["debug from user code"]
    assert debug["levelname"] == "DEBUG"
    assert (debug["application"], debug["deployment"]) == ("echo", "Echo")
    assert debug["replica"].startswith("Echo") and debug["route"] == "/echo"
    assert debug["filename"] == "ks_echo_app.py" and isinstance(debug["lineno"], int)
    assert debug["name"] == "ray.serve" and messages["info from user code"]["name"] == "echo.user"
    assert "asctime" in debug


@pytest.fixture(scope="module")
def small_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    args = ("--log-max-bytes", "4000", "--log-backups", "2")
    with running_kubeserve(tmp_path_factory.mktemp("small-logs"), args=args) as server:
        yield server


def test_replica_logs_rotate_at_the_size_keeping_the_backups(small_logs: Kubeserve) -> None:
    ks = small_logs
    assert ks.put([{**ECHO, "deployments": [{"name": "Echo", "num_replicas": 1}]}])[0] == 200
    ks.wait_app("echo")
    for i in range(150):  # an access line each, about 100 bytes
        assert http("GET", f"{ks.proxy}/echo/str", headers={"X-Request-Id": f"r{i}"})[0] == 200
    (log,) = replica_logs(ks, "echo", "Echo")
    wanted = [log.name, log.name + ".1", log.name + ".2"]
    # access lines are written in batches, every 0.1 s
    wait_for(lambda: sorted(p.name for p in log.parent.glob(log.name + "*")) == wanted, 10)
    assert all(p.stat().st_size <= 4000 for p in log.parent.glob(log.name + "*"))
    assert "-- GET /echo 200 " in log.read_text()  # the current file is the one written


def test_the_proxys_logging_config_is_fixed_while_it_runs(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([ECHO])[0] == 200
    status, body = ks.put([ECHO], logging_config={"encoding": "JSON"})
    assert status == 409 and "logging_config" in body["error"], body
    assert ks.put([ECHO], logging_config={"encoding": "TEXT"})[0] == 200  # Ray's defaults
