"""kubeserve's one client of its admin API: behind ``kubeserve deploy|status|config|shutdown|logs``,
what ``kubeserve start --deploy`` and ``kubeserve run`` do once the server is up, and the Ray
driver API of scripts (:mod:`kubeserve.compat.ray.serve.driver`, which runs it on its own thread).

Everything goes through the REST API (the same one Ray's ``serve`` CLI uses), so these commands
work against ``kubeserve start`` and against the operator alike; only ``logs`` reads files, the
replica log files the GET details name, and therefore runs on the machine ``kubeserve start`` runs
on (on Kubernetes, ``kubectl logs`` reads the same output: see the README).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import yaml

#: where a client looks for kubeserve when told nothing else (``kubeserve start``'s admin API)
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: the path of every application's details (GET), config (PUT) and shutdown (DELETE)
APPLICATIONS_PATH = "/api/serve/applications/"
#: One application by name: ``serve.run`` PUTs it (imperatively), ``serve.delete`` DELETEs it
#: (kubeserve's own path; Ray's driver reaches its controller directly).
APPLICATION_PATH = "/api/kubeserve/applications/{name}"
#: how often ``deploy --wait`` and ``logs --follow`` look again
POLL_S = 0.5
#: statuses after which ``deploy --wait`` stops waiting for an application
_DONE = {"RUNNING": True, "DEPLOY_FAILED": False, "UNHEALTHY": False}


@dataclass
class AdminClient:
    address: str
    token: str | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    def _session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=60))

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with (
            self._session() as session,
            session.request(method, f"{self.address}{path}", json=body) as response,
        ):
            return response.status, await response.json(content_type=None)

    def _report_error(self, status: int, body: Any) -> int:
        message = body.get("error", body) if isinstance(body, dict) else body
        print(f"error: HTTP {status}: {message}", file=self.err)
        for detail in body.get("details", []) if isinstance(body, dict) else []:
            loc = ".".join(str(p) for p in detail["loc"])
            print(f"  {loc}: {detail['msg']}", file=self.err)
        return 1

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of one call (``None`` for an empty one); :class:`AdminError` for a
        status other than 2xx, :class:`aiohttp.ClientError` (an :class:`OSError` when nothing
        answers) for a failed connection."""
        status, answer = await self._call(method, path, body)
        if not 200 <= status < 300:
            raise AdminError(status, answer)
        return answer

    async def details(self) -> dict[str, Any]:
        return dict(await self.request("GET", APPLICATIONS_PATH))

    # -- commands --------------------------------------------------------------------------------
    async def deploy(self, path: Path, *, wait: bool = False, timeout_s: float = 600.0) -> int:
        """PUT a config file; with ``wait``, show progress until every application it names is
        RUNNING (0) or one is DEPLOY_FAILED or UNHEALTHY, or ``timeout_s`` passes (1)."""
        try:
            config = yaml.safe_load(path.read_text())  # noqa: ASYNC240 - a small local file
        except (OSError, yaml.YAMLError) as exc:
            print(f"error: cannot read {path}: {exc}", file=self.err)
            return 1
        return await self.put(config, wait=wait, timeout_s=timeout_s, source=str(path))

    async def put(
        self, config: Any, *, wait: bool = False, timeout_s: float = 600.0, source: str = "config"
    ) -> int:
        """PUT a config (multi-application when it has ``applications``); see :meth:`deploy`."""
        multi = isinstance(config, dict) and "applications" in config
        family = "applications" if multi else "deployments"
        status, body = await self._call("PUT", f"/api/serve/{family}/", config)
        if status != 200:
            return self._report_error(status, body)
        print(f"deployed {source} to {self.address}", file=self.out, flush=True)
        if not wait:
            return 0
        return await self.wait_for(list(body.get("applications", [])), timeout_s)

    async def wait_for(self, names: list[str], timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        shown: dict[str, str] = {}
        while True:
            try:
                apps = (await self.details()).get("applications", {})
            except (AdminError, aiohttp.ClientError) as exc:
                print(f"error: {exc}", file=self.err)
                return 1
            outcome: dict[str, bool] = {}
            for name in names:
                app = apps.get(name)
                line = progress_line(name, app)
                if shown.get(name) != line:
                    shown[name] = line
                    print(line, file=self.out, flush=True)
                if app is not None and app["status"] in _DONE:
                    outcome[name] = _DONE[app["status"]]
            failed = [name for name, ok in outcome.items() if not ok]
            if failed:
                for name in failed:
                    print(f"{name}: {apps[name]['message']}", file=self.err)
                return 1
            if len(outcome) == len(names):
                return 0
            if time.monotonic() > deadline:
                print(f"error: not RUNNING after {timeout_s:g} s", file=self.err)
                return 1
            await asyncio.sleep(POLL_S)

    async def show(self, command: str) -> int:
        method = "DELETE" if command == "shutdown" else "GET"
        status, body = await self._call(method, APPLICATIONS_PATH)
        if status != 200:
            return self._report_error(status, body)
        if command == "status":
            print(yaml.safe_dump(status_summary(body), sort_keys=False), end="", file=self.out)
        elif command == "config":
            configs = [app["deployed_app_config"] for app in body.get("applications", {}).values()]
            print(yaml.safe_dump_all(configs, sort_keys=False), end="", file=self.out)
        else:
            print("shut down", file=self.out)
        return 0

    async def logs(
        self, app: str, deployment: str | None, *, follow: bool = False, tail: int = 100
    ) -> int:
        """Print the logs of an application's replicas (or of one deployment's), each line
        prefixed with its deployment and replica; with ``follow``, keep printing what they write,
        replicas started later included, until interrupted."""
        offsets: dict[str, int] = {}
        while True:
            try:
                files = replica_logs(await self.details(), app, deployment)
            except LookupError as exc:
                print(f"error: {exc}", file=self.err)
                return 1
            except (AdminError, aiohttp.ClientError) as exc:
                print(f"error: {exc}", file=self.err)
                return 1
            for label, path in files.items():
                first = label not in offsets
                start, lines = offsets.get(label, 0), tail if first else 0
                offsets[label] = _print_new(path, label, start, lines, self.out)
            if not follow:
                return 0
            await asyncio.sleep(POLL_S)


class AdminError(Exception):
    """The admin API answered with a status other than 2xx."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        message = body.get("error", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


def progress_line(name: str, app: Mapping[str, Any] | None) -> str:
    """``app: DEPLOYING  Frontend 1/1 RUNNING, Greeter 0/2 STARTING``: one line of progress."""
    if app is None:
        return f"{name}: waiting for the controller"
    parts = []
    for dname, dep in sorted(app.get("deployments", {}).items()):
        replicas = dep.get("replicas", [])
        running = sum(1 for r in replicas if r.get("state") == "RUNNING")
        target = dep.get("target_num_replicas", len(replicas))
        parts.append(f"{dname} {running}/{target} {dep.get('status', '')}".rstrip())
    return f"{name}: {app['status']}" + (f"  {', '.join(parts)}" if parts else "")


def replica_logs(details: Mapping[str, Any], app: str, deployment: str | None) -> dict[str, Path]:
    """``"deployment replica_id"`` -> log file, for the replicas the details list."""
    apps = details.get("applications", {})
    if app not in apps:
        raise LookupError(f"no application {app!r} (running: {', '.join(sorted(apps)) or 'none'})")
    deployments = apps[app].get("deployments", {})
    if deployment is not None and deployment not in deployments:
        known = ", ".join(sorted(deployments)) or "none yet"
        raise LookupError(f"application {app!r} has no deployment {deployment!r} ({known})")
    files: dict[str, Path] = {}
    for dname, dep in sorted(deployments.items()):
        if deployment is not None and dname != deployment:
            continue
        for replica in dep.get("replicas", []):
            if replica.get("log_file_path"):
                files[f"{dname} {replica['replica_id']}"] = Path(replica["log_file_path"])
    return files


def _print_new(path: Path, label: str, offset: int, tail: int, out: TextIO) -> int:
    """Print ``path`` from ``offset`` (or its last ``tail`` lines when starting) with ``label``;
    returns the new offset. A file that rotated (shrank) is read from its start."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for its end
    lines = data[:end].decode("utf-8", "replace").splitlines(keepends=True)
    if tail:
        lines = lines[-tail:]
    for line in lines:
        out.write(f"[{label}] {line}")
    out.flush()
    return offset + end


def status_summary(details: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "proxies": {
            node: proxy.get("status") for node, proxy in details.get("proxies", {}).items()
        },
        "applications": {
            name: {
                "status": app["status"],
                "message": app["message"],
                "deployments": {
                    dname: {
                        "status": dep["status"],
                        "replicas": len(dep["replicas"]),
                        "message": dep["message"],
                    }
                    for dname, dep in app["deployments"].items()
                },
            }
            for name, app in details.get("applications", {}).items()
        },
    }
