"""The two serving systems the benchmark compares, started and stopped on 127.0.0.1.

Both speak the same admin REST API (``PUT/GET /api/serve/applications/``, the Ray 2.60 schema), so
one :class:`ServeSystem` drives both; the subclasses only know how to start, stop and find their
processes. Everything binds to 127.0.0.1 on free ports, so a Ray left on its default ports (8265,
8000) by someone else does not collide with the bench.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import common
from support.common import ROOT, free_port

BENCH_DIR = ROOT / "benchmarks"


def http(method: str, url: str, body: Any = None, timeout: float = 30) -> Any:
    """One JSON request; returns the decoded body (or the raw text when it is not JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> None:
    """Until ``predicate`` holds; a system still starting (refused, 404, half-written answer)
    counts as not yet."""
    common.wait_for(predicate, timeout, interval, ignoring=(OSError, KeyError, ValueError))


def rss_mb(pid: int) -> float:
    """Resident set size of one process, from /proc (MB = 2**20 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pids_matching(fragment: str) -> list[int]:
    """PIDs whose command line (or process title, which Ray sets) contains ``fragment``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmdline:
            found.append(int(entry.name))
    return found


class ServeSystem:
    """A serving layer reachable through the Ray-compatible admin API and an HTTP proxy."""

    name = ""

    def __init__(self) -> None:
        self.api_port = free_port()
        self.proxy_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"

    # -- lifecycle (subclasses) --------------------------------------------------------------

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def process_pids(self) -> dict[str, int]:
        """PIDs of the ``controller`` and ``proxy`` processes."""
        raise NotImplementedError

    # -- admin API ---------------------------------------------------------------------------

    def put(self, applications: list[dict[str, Any]]) -> None:
        config = {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": self.proxy_port},
            "applications": applications,
        }
        http("PUT", f"{self.api}/api/serve/applications/", config)

    def applications(self) -> dict[str, Any]:
        return dict(http("GET", f"{self.api}/api/serve/applications/")["applications"] or {})

    def app_running(self, app: str) -> bool:
        found = self.applications().get(app)
        return bool(found and found["status"] == "RUNNING")

    def running_replicas(self, app: str, deployment: str) -> list[dict[str, Any]]:
        found = self.applications().get(app)
        if not found or deployment not in found["deployments"]:
            return []
        replicas = found["deployments"][deployment]["replicas"]
        return [r for r in replicas if r.get("state") == "RUNNING"]

    def wait_replicas(self, app: str, deployment: str, count: int, timeout: float) -> None:
        """Until exactly ``count`` replicas run and the application is RUNNING."""
        wait_for(
            lambda: len(self.running_replicas(app, deployment)) == count and self.app_running(app),
            timeout,
            0.005,
        )

    def get(self, path: str, timeout: float = 10) -> Any:
        return http("GET", f"http://127.0.0.1:{self.proxy_port}{path}", timeout=timeout)

    # -- driver scripts (serve.run) ----------------------------------------------------------

    def driver(self, script: Path) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run a Ray Serve driver script against this system
        as its users run it (``PROXY_URL``: the proxy)."""
        raise NotImplementedError

    def delete_app(self, name: str) -> None:
        """Remove application ``name`` (deployed by a driver's ``serve.run``); returns once gone."""
        raise NotImplementedError

    def _driver_env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PROXY_URL": f"http://127.0.0.1:{self.proxy_port}", **extra}


class Kubeserve(ServeSystem):
    """``kubeserve start`` from the repository's virtualenv, state in a temporary directory."""

    name = "kubeserve"

    def __init__(self) -> None:
        super().__init__()
        self._state = tempfile.TemporaryDirectory(prefix="kubeserve-bench-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeserve.cli", "start", "--dashboard-port", str(self.api_port),
             "--http-host", "127.0.0.1", "--http-port", str(self.proxy_port),
             "--state-dir", self._state.name],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: bool(http("GET", f"{self.api}/api/ray/version", timeout=2)), 60, 0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._state.cleanup()

    def driver(self, script: Path) -> tuple[list[str], dict[str, str]]:
        env = self._driver_env(KUBESERVE_ADDRESS=self.api, KUBESERVE_STATE_DIR=self._state.name)
        return [sys.executable, "-m", "kubeserve.compat", str(script)], env

    def delete_app(self, name: str) -> None:
        http("DELETE", f"{self.api}/api/kubeserve/applications/{name}")
        wait_for(lambda: name not in self.applications(), 60, 0.02)

    def process_pids(self) -> dict[str, int]:
        assert self.proc is not None
        details = http("GET", f"{self.api}/api/serve/applications/")
        proxy = next(iter(details["proxies"].values()))
        return {"controller": self.proc.pid, "proxy": int(proxy["worker_id"])}


class RayServe(ServeSystem):
    """A local Ray head (``ray start --head``) from the Ray 2.60 virtualenv, on 127.0.0.1.

    Ray's workers inherit ``PYTHONPATH`` from the raylet, so ``ray_apps:noop`` imports without a
    runtime_env upload. Small resources: 2 CPUs, a 100 MB object store.
    """

    name = "Ray Serve 2.60"

    def __init__(self, venv: Path) -> None:
        super().__init__()
        self.bin = venv / "bin"
        self._temp = tempfile.mkdtemp(prefix="ray-bench-")
        self.gcs = ""  # the head's GCS address once started (a driver's RAY_ADDRESS)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(BENCH_DIR),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ADDRESS": "",
            # a ~/.ray/auth_token left by any earlier Ray run turns Ray 2.60's token auth on, and
            # the bench's HTTP clients carry no token: the head runs without, as by default
            "RAY_AUTH_MODE": "disabled",
        }

    def driver(self, script: Path) -> tuple[list[str], dict[str, str]]:
        return [str(self.bin / "python"), str(script)], self._driver_env(RAY_ADDRESS=self.gcs)

    def delete_app(self, name: str) -> None:
        """``serve.delete`` from Ray's own client (Ray's REST API deletes only everything)."""
        code = f"from ray import serve; serve.delete({name!r})"
        subprocess.run(
            [str(self.bin / "python"), "-c", code], env={**self.env, "RAY_ADDRESS": self.gcs},
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip

    def start(self) -> None:
        gcs_port = free_port()
        self.gcs = f"127.0.0.1:{gcs_port}"
        subprocess.run(
            [str(self.bin / "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
             f"--port={gcs_port}", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={self.api_port}", "--include-dashboard=true", "--num-cpus=2",
             "--object-store-memory=100000000", "--disable-usage-stats",
             f"--temp-dir={self._temp}"],
            env=self.env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=180,
        )  # fmt: skip
        wait_for(lambda: bool(http("GET", f"{self.api}/api/ray/version", timeout=2)), 120, 0.2)

    def stop(self) -> None:
        subprocess.run(
            [str(self.bin / "ray"), "stop", "--force"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip

    def process_pids(self) -> dict[str, int]:
        # Ray names its actor processes by process title.
        return {
            "controller": pids_matching("ray::ServeController")[0],
            "proxy": pids_matching("ray::ProxyActor")[0],
        }


def serve_bench_apps() -> str:
    """Put this directory on ``PYTHONPATH`` (the processes both systems start inherit it), so
    ``import_path: ray_api_apps:...`` resolves to the same file on both; returns a line on the
    machine for the report."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    return f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the start"
