"""A real ``kubeserve start`` process, talked to over real HTTP, and the apps tests deploy to it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.common import ROOT, free_port, http, pid_alive, wait_for


def slow_app(*deployments: dict[str, Any], graph: str = "slow", **fields: Any) -> dict[str, Any]:
    """An application of ``tests/apps/ks_autoscale_app.py`` named and routed as ``graph``:
    ``slow`` (its ``Slow`` deployment sleeps ``?s=`` seconds per request) or ``front`` (``Front``
    calls ``Slow`` through a handle), with these ``deployments`` overrides."""
    app = {"name": graph, "route_prefix": f"/{graph}", "import_path": f"ks_autoscale_app:{graph}"}
    return {**app, **({"deployments": list(deployments)} if deployments else {}), **fields}


class Kubeserve:
    """A ``kubeserve start`` process with its own state directory and ports.

    With ``token`` the admin API requires it (passed as ``KUBESERVE_AUTH_TOKEN``) and the helpers
    below send it; ``args`` are more ``kubeserve start`` arguments; ``code``: the checkout whose
    ``operator/`` it runs (this one by default; a bench compares another's in the same run);
    ``python_path``: more folders importable in it and in its children (before the others).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        token: str | None = None,
        args: tuple[str, ...] = (),
        code: Path = ROOT,
        python_path: tuple[Path, ...] = (),
    ) -> None:
        self.state_dir = state_dir
        self.python_path = python_path
        self.dashboard_port = free_port()
        self.proxy_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / "kubeserve-start.log"
        self.token = token
        self.args = args
        self.code = code
        self.tls = False

    @property
    def headers(self) -> dict[str, str]:
        """What a client of this server sends: its bearer token, if it has one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [*map(str, self.python_path), str(ROOT / "tests" / "apps"), str(self.code / "operator")]
        )
        env.pop("KUBESERVE_AUTH_TOKEN", None)
        if self.token:
            env["KUBESERVE_AUTH_TOKEN"] = self.token
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubeserve.cli",
                "start",
                "--dashboard-port",
                str(self.dashboard_port),
                "--state-dir",
                str(self.state_dir),
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.proxy_port),
                *self.args,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, 30, what="the admin API to answer")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"kubeserve start exited: {self.log()}")
        try:
            return http("GET", f"{self.api}/-/healthz", timeout=1)[0] == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop the process; returns its exit code (-9 when it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    # -- API helpers ------------------------------------------------------------------------------
    def config(self, applications: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        return {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": self.proxy_port},
            "applications": applications,
            **options,
        }

    def put(self, applications: list[dict[str, Any]], **options: Any) -> tuple[int, Any]:
        # the proxy speaks HTTPS: the tests that ask for it talk to it with their own clients
        self.tls = bool((options.get("http_options") or {}).get("ssl_certfile"))
        return http(
            "PUT",
            f"{self.api}/api/serve/applications/",
            self.config(applications, **options),
            headers=self.headers,
        )

    def details(self) -> dict[str, Any]:
        status, body = http("GET", f"{self.api}/api/serve/applications/", headers=self.headers)
        assert status == 200, body
        return dict(body)

    def app(self, name: str) -> dict[str, Any] | None:
        return self.details()["applications"].get(name)

    def wait_app(self, name: str, status: str = "RUNNING", timeout_s: float = 60) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            app = self.app(name)
            return app if app is not None and app["status"] == status else None

        try:
            found = wait_for(ready, timeout_s, what=f"application {name!r} to be {status}")
            if status == "RUNNING":  # tests go on to send traffic: the proxy must be up too
                self.wait_proxy()
                self.wait_routed(name, found.get("route_prefix"))
            return found
        except AssertionError as err:
            raise AssertionError(f"{err}\napp={self.app(name)}\nlog={self.log()}") from None

    def wait_routed(self, app: str, route_prefix: str | None) -> None:
        """Until the proxy's ``/-/routes`` lists ``app`` at ``route_prefix`` (it learns routes by
        long-poll, a moment after the controller reports the application RUNNING, as Ray's
        proxies do)."""
        if route_prefix is None or self.tls:
            return

        def routed() -> bool:
            try:
                status, routes = http("GET", f"{self.proxy}/-/routes", timeout=5)
            except OSError:
                return False
            return status == 200 and isinstance(routes, dict) and routes.get(route_prefix) == app

        wait_for(routed, 30, what=f"the proxy to route {route_prefix} to {app!r}")

    def wait_proxy(self) -> None:
        def healthy() -> bool:
            proxies = self.details()["proxies"].values()
            return bool(proxies) and all(p["status"] == "HEALTHY" for p in proxies)

        wait_for(healthy, 30, what="the proxy to be HEALTHY")

    def replica_pids(self, app: str, deployment: str) -> list[int]:
        details = self.app(app) or {"deployments": {}}
        replicas = details["deployments"].get(deployment, {"replicas": []})["replicas"]
        return sorted(r["pid"] for r in replicas if r["state"] == "RUNNING")

    def replica_request(
        self, pid: int, method: str, path: str, body: bytes = b""
    ) -> tuple[int, bytes]:
        """An internal request to the replica process ``pid`` over the authenticated channel,
        as the controller makes it (the secret is read from the instance's state directory)."""
        import asyncio

        from kubeserve.runtime import channel

        secret = (self.state_dir / "data-plane.secret").read_text().strip().encode()
        replica_id = self.replica_id(pid)
        return asyncio.run(
            channel.request("127.0.0.1", replica_port(pid), method, path, secret, replica_id, body)
        )

    def running_replicas(
        self, app: str, deployment: str, count: int = 1, timeout_s: float = 60
    ) -> list[int]:
        """The pids of ``deployment``'s RUNNING replicas once there are ``count`` of them (an
        application reported RUNNING can be replacing a replica that failed a health check on a
        loaded machine: the tests that need the process wait for it, and say what they saw)."""

        def counted() -> list[int] | None:
            pids = self.replica_pids(app, deployment)
            return pids if len(pids) == count else None

        try:
            return wait_for(
                counted,
                timeout_s,
                what=f"{count} RUNNING replica(s) of {app}/{deployment}",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\napp={self.app(app)}\nlog={self.log()}") from None

    def replica_id(self, pid: int) -> str:
        """The replica id of the replica process ``pid`` (what the channel handshake names)."""
        for app in self.details()["applications"].values():
            for dep in app["deployments"].values():
                for replica in dep["replicas"]:
                    if replica["pid"] == pid:
                        return str(replica["replica_id"])
        raise LookupError(f"no replica with pid {pid}")

    def wait_replaced(self, app: str, deployment: str, old: int, timeout_s: float = 60) -> None:
        """Wait until ``deployment`` runs replicas again, none of them the process ``old``."""
        wait_for(
            lambda: (pids := self.replica_pids(app, deployment)) and old not in pids,
            timeout_s,
            what=f"a replica of {app}/{deployment} replacing pid {old}",
        )

    def all_pids(self) -> list[int]:
        pids = [
            r["pid"]
            for app in self.details()["applications"].values()
            for dep in app["deployments"].values()
            for r in dep["replicas"]
            if r.get("pid")
        ]
        pids += [
            int(p["worker_id"]) for p in self.details()["proxies"].values() if p.get("worker_id")
        ]
        return pids

    def shutdown(self) -> None:
        pids = self.all_pids()
        status, body = http("DELETE", f"{self.api}/api/serve/applications/", headers=self.headers)
        assert status == 200, body
        wait_for(lambda: not self.details()["applications"], 60, what="applications to go away")
        wait_for(lambda: not any(pid_alive(p) for p in pids), 60, what="processes to exit")


class PickleMarker:
    """A pickle that, if ever loaded, creates the file ``path``: proof that a payload ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def replica_port(pid: int) -> int:
    """The port of a replica process, from its command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(args[args.index(b"--port") + 1])


@contextlib.contextmanager
def running_kubeserve(
    state_dir: Path,
    *,
    token: str | None = None,
    args: tuple[str, ...] = (),
    code: Path = ROOT,
    python_path: tuple[Path, ...] = (),
) -> Iterator[Kubeserve]:
    server = Kubeserve(state_dir, token=token, args=args, code=code, python_path=python_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
