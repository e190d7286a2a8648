"""Control-plane figures of the embedded backend, measured against a real ``kubeserve start``.

    .venv/bin/python benchmarks/control_plane.py [--runs 5]

Prints medians (and all samples) of:
- PUT -> RUNNING of the composed example (a fresh deploy; DELETE and wait for no process between
  runs);
- user_config change -> applied (PUT with a new greeting -> application RUNNING again, every replica
  reconfigured; checked through the proxy too);
- RSS of a replica, of the proxy and of the ``kubeserve start`` process (controller + admin API).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def call(method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


class Bench:
    def __init__(self, state_dir: Path) -> None:
        self.api_port, self.proxy_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeserve.cli", "start", "--dashboard-port", str(self.api_port),
             "--state-dir", str(state_dir)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.wait(lambda: self._up(), 30)

    def _up(self) -> bool:
        try:
            return bool(call("GET", f"{self.api}/api/ray/version"))
        except OSError:
            return False

    @staticmethod
    def wait(predicate: Any, timeout: float, interval: float = 0.005) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(interval)
        raise TimeoutError("condition not met")

    def config(self, greeting: str) -> dict[str, Any]:
        return {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": self.proxy_port},
            "applications": [
                {
                    "name": "composed",
                    "route_prefix": "/",
                    "import_path": "examples.composed:app",
                    "deployments": [{"name": "Greeter", "user_config": {"greeting": greeting}}],
                }
            ],
        }

    def details(self) -> dict[str, Any]:
        return dict(call("GET", f"{self.api}/api/serve/applications/"))

    def app_running(self) -> bool:
        app = self.details()["applications"].get("composed")
        return bool(app and app["status"] == "RUNNING")

    def pids(self) -> dict[str, list[int]]:
        details = self.details()
        found: dict[str, list[int]] = {"replica": [], "proxy": []}
        for app in details["applications"].values():
            for dep in app["deployments"].values():
                found["replica"] += [r["pid"] for r in dep["replicas"] if r.get("pid")]
        found["proxy"] = [int(p["worker_id"]) for p in details["proxies"].values()]
        return found

    def greeting(self) -> str:
        url = f"http://127.0.0.1:{self.proxy_port}/?name=x"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(json.loads(response.read())["message"])

    def answers(self) -> bool:
        try:
            return self.greeting() == "Hello, x!"
        except OSError:
            return False

    def deploy_time(self) -> tuple[float, float]:
        """(PUT -> status RUNNING, PUT -> first answer through the proxy)."""
        start = time.perf_counter()
        call("PUT", f"{self.api}/api/serve/applications/", self.config("Hello"))
        self.wait(self.app_running, 60)
        running = time.perf_counter() - start
        self.wait(self.answers, 60)
        return running, time.perf_counter() - start

    def user_config_time(self, greeting: str) -> float:
        start = time.perf_counter()
        call("PUT", f"{self.api}/api/serve/applications/", self.config(greeting))
        self.wait(self.app_running, 30, 0.002)
        elapsed = time.perf_counter() - start
        assert self.greeting() == f"{greeting}, x!"
        return elapsed

    def delete(self) -> None:
        pids = [pid for group in self.pids().values() for pid in group]
        call("DELETE", f"{self.api}/api/serve/applications/")
        self.wait(lambda: not any(pid_alive(p) for p in pids), 60, 0.02)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        bench = Bench(Path(state))
        try:
            deploys, answers, reconfigures = [], [], []
            for run in range(args.runs):
                running, answered = bench.deploy_time()
                deploys.append(running)
                answers.append(answered)
                reconfigures.append(bench.user_config_time(f"Greeting{run}"))
                if run < args.runs - 1:
                    bench.delete()
            pids = bench.pids()
            rss = {
                "replica": statistics.median(rss_mb(p) for p in pids["replica"]),
                "proxy": rss_mb(pids["proxy"][0]),
                "controller": rss_mb(bench.proc.pid),
            }
            bench.delete()
        finally:
            bench.stop()
    print(f"PUT -> RUNNING (composed example): median {statistics.median(deploys):.3f} s "
          f"over {args.runs}: {[round(x, 3) for x in deploys]}")  # fmt: skip
    print(f"PUT -> first answer via the proxy:  median {statistics.median(answers):.3f} s "
          f"over {args.runs}: {[round(x, 3) for x in answers]}")  # fmt: skip
    reconfigure_ms = [round(x * 1000, 1) for x in reconfigures]
    print(f"user_config change -> applied:      median {statistics.median(reconfigure_ms):.1f} ms "
          f"over {args.runs}: {reconfigure_ms}")  # fmt: skip
    for role, value in rss.items():
        print(f"RSS {role}: {value:.1f} MB")


if __name__ == "__main__":
    main()
