"""The operator's figures, measured on the real single-node cluster of the kubernetes tier.

- CR create -> Ready: ``kubectl apply`` of a ServeApplication (``e2e_probe:app``, and the composed
  test application ``ks_composed_app:app``) until its ``Ready`` condition is True, polled every
  50 ms straight against the API server; median of 5, the application deleted (and its pods,
  Jobs and ConfigMaps gone) between runs, so every run builds and starts from nothing.
- API requests when nothing changes: the operator talks to the API server only through a counting
  reverse proxy run here (plain HTTP on 127.0.0.1, streaming watch responses line by line), so
  every request of its own client and of kopf's is counted by verb and resource.
- Operator RSS (``VmRSS`` of the process) with 0, 1 and 100 applications.

Run with ``make bench-operator``; results go to ``benchmarks/operator-results.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import ssl
import statistics
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import yaml
from aiohttp import web

from kubeserve.runtime.kubernetes import contract
from support.common import free_port, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import OperatorProcess, install_crds
from support.node_cluster import find_node_bin_dir, node_missing, start_node_cluster

ROOT = Path(__file__).resolve().parents[1]

NAMESPACE = "bench"
GROUP_PATH = f"/apis/{contract.API_VERSION}/namespaces"
POLL_S = 0.05
RESULTS = ROOT / "benchmarks" / "operator-results.md"
LOG = ROOT / "var" / "bench-operator.log"
BATCH = 10
APP_LABEL = contract.APPLICATION_LABEL

# --------------------------------------------------------------------------- counting proxy

#: Headers that belong to one hop; the proxy sets its own. Accept-Encoding is dropped so that
#: responses come back uncompressed and can be streamed through unchanged.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "upgrade",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "content-encoding",
    }
)


@dataclass(frozen=True)
class ApiRequest:
    """One request the operator made: when (monotonic), what, and which client sent it."""

    at: float
    verb: str
    resource: str
    client: str
    #: the request body of writes (PATCH, PUT, POST), to show what an idle operator writes
    body: bytes = b""

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


def classify(method: str, path: str, query: str) -> tuple[str, str]:
    """(verb, resource) of an API request, as in the API server's audit log.

    ``resource`` keeps subresources (``serveapplications/status``); discovery and health paths
    are reported as ``discovery <path>``.
    """
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return "discovery", path
    if not rest:
        return "discovery", path
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        watch = parse_qs(query).get("watch", [""])[0] in ("true", "1")
        verb = "watch" if watch else ("get" if name else "list")
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
    return verb, resource


def client_name(user_agent: str) -> str:
    """kopf's requests say ``kopf/<version>``; the operator's own client is kubernetes_asyncio."""
    return "kopf" if user_agent.lower().startswith("kopf") else "kubeserve"


class CountingProxy:
    """A plain-HTTP reverse proxy on 127.0.0.1 in front of the HTTPS API server.

    It runs in its own thread and event loop; every request is recorded before it is forwarded.
    Response bodies are copied chunk by chunk as they arrive, so watches stream unbuffered.
    """

    def __init__(self, upstream: str, ca_file: Path, token: str) -> None:
        self.upstream, self.token = upstream, token
        self.ssl = ssl.create_default_context(cafile=str(ca_file))
        self.port = free_port()
        self.requests: list[ApiRequest] = []
        #: (client, resource) -> watches open now
        self.open_watches: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def since(self, start: float, end: float | None = None) -> list[ApiRequest]:
        with self._lock:
            return [r for r in self.requests if r.at >= start and (end is None or r.at < end)]

    async def _start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ssl=self.ssl)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        verb, resource = classify(request.method, request.path, request.query_string)
        body = await request.read() if request.method in ("PATCH", "PUT", "POST") else b""
        client = client_name(request.headers.get("User-Agent", ""))
        record = ApiRequest(time.monotonic(), verb, resource, client, body)
        with self._lock:
            self.requests.append(record)
            self.open_watches[(client, resource)] += record.is_watch
        try:
            return await self._relay(request)
        finally:
            with self._lock:
                self.open_watches[(client, resource)] -= record.is_watch

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers.setdefault("Authorization", f"Bearer {self.token}")
        body = await request.read()
        async with self._session.request(
            request.method,
            f"{self.upstream}{request.path_qs}",
            headers=headers,
            data=body or None,
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_HEADERS:
                    response.headers[key] = value
            with contextlib.suppress(ConnectionResetError):  # the client went away
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
        return response


def proxy_kubeconfig(path: Path, port: int, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [
            {
                "name": "bench",
                "context": {"cluster": "bench", "user": "admin", "namespace": NAMESPACE},
            }
        ],
        "current-context": "bench",
    }
    path.write_text(yaml.safe_dump(config))
    return path


# --------------------------------------------------------------------------- operator process


# --------------------------------------------------------------------------- custom resources


def instance(proxy_location: str = "HeadOnly") -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ServeInstance",
        "metadata": {"name": contract.DEFAULT_INSTANCE, "namespace": NAMESPACE},
        "spec": {"proxyLocation": proxy_location, "httpOptions": {"port": 8000}},
    }


def application(name: str, import_path: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ServeApplication",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"importPath": import_path, **spec},
    }


def cr_status(plane: ControlPlane, plural: str, name: str) -> dict[str, Any] | None:
    """The object's status, read directly from the API server (not through the proxy)."""
    try:
        obj = plane.api("GET", f"{GROUP_PATH}/{NAMESPACE}/{plural}/{name}")
    except urllib.error.HTTPError:
        return None
    status = obj.get("status") or {}
    return {**status, "_generation": obj["metadata"].get("generation")}


def is_ready(status: dict[str, Any] | None) -> bool:
    if not status or status.get("observedGeneration") != status["_generation"]:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def wait_ready(plane: ControlPlane, plural: str, name: str, timeout_s: float) -> None:
    def ready() -> bool:
        return is_ready(cr_status(plane, plural, name))

    try:
        wait_for(ready, timeout_s, interval_s=POLL_S, what=f"{plural}/{name} Ready")
    except AssertionError:
        pods = plane.kubectl("get", "pods,jobs,deploy", "-n", NAMESPACE, "-o", "wide").stdout
        raise RuntimeError(
            f"{plural}/{name} not Ready: {cr_status(plane, plural, name)}\n{pods}"
        ) from None


def owned_left(plane: ControlPlane, app: str) -> int:
    """Pods, Jobs and ConfigMaps of ``app`` still present (terminating ones included)."""
    found = plane.get("pods,jobs,configmaps", namespace=NAMESPACE, selector=f"{APP_LABEL}={app}")
    return len(found["items"])


# --------------------------------------------------------------------------- (a) create -> Ready


@dataclass
class ReadySamples:
    import_path: str
    seconds: list[float] = field(default_factory=list)
    apply_s: list[float] = field(default_factory=list)
    error: str = ""


def measure_create_to_ready(
    plane: ControlPlane, import_path: str, runs: int, timeout_s: float
) -> ReadySamples:
    samples = ReadySamples(import_path)
    stem = import_path.split(":")[0].replace("_", "-")
    for run in range(1, runs + 1):
        name = f"{stem}-{run}"
        before = time.monotonic()
        plane.apply(application(name, import_path, routePrefix="/timed"))
        applied = time.monotonic()
        try:
            wait_ready(plane, "serveapplications", name, timeout_s)
        except RuntimeError as err:
            samples.error = str(err)[:2000]
            delete_application(plane, name)
            return samples
        samples.seconds.append(time.monotonic() - applied)
        samples.apply_s.append(applied - before)
        print(f"  {import_path} run {run}: {samples.seconds[-1]:.2f} s", flush=True)
        delete_application(plane, name)
    return samples


def delete_application(plane: ControlPlane, name: str) -> None:
    plane.kubectl("delete", "serveapplication", name, "-n", NAMESPACE, "--timeout=60s")
    wait_for(lambda: owned_left(plane, name) == 0, 120, interval_s=0.2, what=f"{name} gone")


# --------------------------------------------------------------------------- (c) idle requests


@dataclass
class IdleWindow:
    label: str
    seconds: float
    requests: list[ApiRequest]
    open_watches: dict[tuple[str, str], int]
    #: application names in the ServeInstance's status at the end of the window
    instance_apps: list[str] = field(default_factory=list)

    def per_minute(self, count: int) -> float:
        return count * 60.0 / self.seconds

    def watches(self) -> list[ApiRequest]:
        return [r for r in self.requests if r.is_watch]

    def others(self) -> list[ApiRequest]:
        return [r for r in self.requests if not r.is_watch]


def measure_idle(proxy: CountingProxy, label: str, settle_s: float, window_s: float) -> IdleWindow:
    print(f"  idle ({label}): settling {settle_s:.0f} s, counting {window_s:.0f} s", flush=True)
    time.sleep(settle_s)
    start = time.monotonic()
    time.sleep(window_s)
    end = time.monotonic()
    with proxy._lock:
        watches = {k: n for k, n in proxy.open_watches.items() if n}
    return IdleWindow(label, end - start, proxy.since(start, end), watches)


def instance_applications(plane: ControlPlane) -> list[str]:
    status = cr_status(plane, "serveinstances", "default") or {}
    return sorted(status.get("applications") or {})


# --------------------------------------------------------------------------- (b) 100 applications


@dataclass
class ManyApps:
    count: int
    #: replica pods per application (0: autoscaling from zero)
    replicas: int
    seconds_to_steady: float
    statuses: Counter[str]
    #: one status message per non-Ready status, to say why
    messages: dict[str, str]
    pods_running: int
    loadavg: tuple[float, float, float]
    rss_mib: float


def app_statuses(plane: ControlPlane, names: set[str]) -> tuple[Counter[str], dict[str, str]]:
    """How many of ``names`` are Ready (condition True, current generation), else by appStatus,
    with one message per non-Ready status."""
    items = plane.api("GET", f"{GROUP_PATH}/{NAMESPACE}/serveapplications")["items"]
    counts: Counter[str] = Counter()
    messages: dict[str, str] = {}
    for obj in items:
        if obj["metadata"]["name"] not in names:
            continue
        status = {**(obj.get("status") or {}), "_generation": obj["metadata"].get("generation")}
        key = "Ready" if is_ready(status) else str(status.get("appStatus") or "none")
        counts[key] += 1
        if key != "Ready":
            messages.setdefault(key, f"{obj['metadata']['name']}: {status.get('message', '')}")
    return counts, messages


def many_applications(count: int, replicas: int) -> list[dict[str, Any]]:
    """With 0 replicas (autoscaling, minReplicas 0), each application is still built by a real
    Job and reconciled into a Deployment, Service and status, but runs no replica process, so
    100 of them fit on a 2-core machine beside the control plane."""
    if replicas:
        deployment: dict[str, Any] = {"name": "Probe", "numReplicas": replicas}
    else:
        deployment = {"name": "Probe", "autoscalingConfig": {"minReplicas": 0, "maxReplicas": 1}}
    return [
        application(
            f"many-{i:03d}",
            "e2e_probe:app",
            routePrefix=f"/many-{i:03d}",
            deployments=[deployment],
        )
        for i in range(count)
    ]


def deploy_many(
    plane: ControlPlane, op: OperatorProcess, count: int, timeout_s: float, replicas: int
) -> ManyApps:
    """Apply ``count`` applications at once; wait until each is Ready or DEPLOY_FAILED."""
    apps = many_applications(count, replicas)
    names = {a["metadata"]["name"] for a in apps}
    start = time.monotonic()
    for first in range(0, count, BATCH):
        # Ten at a time, each batch once the operator has written a status for the previous
        # one: 100 build pods started at once saturate a 2-CPU machine's API server (504s).
        batch = apps[first : first + BATCH]
        for app in batch:
            plane.api("POST", f"{GROUP_PATH}/{NAMESPACE}/serveapplications", app)
        started = {a["metadata"]["name"] for a in batch}
        wait_for(lambda s=started: "none" not in app_statuses(plane, s)[0], 120, interval_s=1)
    deadline = start + timeout_s
    while True:
        statuses, messages = app_statuses(plane, names)
        if statuses["Ready"] + statuses["DEPLOY_FAILED"] == count or time.monotonic() > deadline:
            break
        print(f"  after {time.monotonic() - start:.0f} s: {dict(statuses)}", flush=True)
        time.sleep(5)
    elapsed = time.monotonic() - start
    pods = plane.get("pods", namespace=NAMESPACE, selector="app.kubernetes.io/component=replica")
    running = sum(1 for p in pods["items"] if p.get("status", {}).get("phase") == "Running")
    load = os.getloadavg()
    return ManyApps(count, replicas, elapsed, statuses, messages, running, load, op.rss_mib())


# --------------------------------------------------------------------------- report


def machine_info() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": f"{cpu}, {os.cpu_count()} CPUs",
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def fmt_samples(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def ready_section(samples: list[ReadySamples]) -> list[str]:
    lines = [
        "## (a) CR create -> Ready",
        "",
        "Time from `kubectl apply` of a ServeApplication returning to its `Ready` condition True",
        f"(status polled every {POLL_S * 1000:.0f} ms directly against the API server). The",
        "ServeInstance (proxyLocation HeadOnly) already exists and is Ready; every run uses a",
        "fresh application name and starts after the previous one's pods, build Job and ConfigMap",
        "are gone, so each run includes the build Job (a pod importing the app) and the replicas.",
        "",
        "| application | median (s) | samples (s) | kubectl apply itself (median, s) |",
        "|---|---|---|---|",
    ]
    for s in samples:
        if s.seconds and not s.error:
            lines.append(
                f"| `{s.import_path}` | **{statistics.median(s.seconds):.2f}** | "
                f"{fmt_samples(s.seconds)} | {statistics.median(s.apply_s):.2f} |"
            )
        else:
            lines.append(f"| `{s.import_path}` | not Ready | {fmt_samples(s.seconds)} | - |")
    for s in samples:
        if s.error:
            lines += ["", f"`{s.import_path}` failed:", "", "```", s.error, "```"]
    return [*lines, ""]


def idle_section(windows: list[IdleWindow]) -> list[str]:
    lines = [
        "## (c) API requests when nothing changes",
        "",
        "Every request of the operator process (its own kubernetes_asyncio client and kopf's)",
        "passes through a counting reverse proxy. After 20 s to settle, requests are counted for",
        "60 s. A watch is one long-lived request; the count is watches (re)started in the window.",
        "",
        "| applications | watch (re)starts / min | other requests / min | watches open |",
        "|---|---|---|---|",
    ]
    for w in windows:
        lines.append(
            f"| {w.label} | {w.per_minute(len(w.watches())):.1f} | "
            f"{w.per_minute(len(w.others())):.1f} | {sum(w.open_watches.values())} |"
        )
    for w in windows:
        lines += ["", f"With {w.label} applications, per minute by client, verb and resource:", ""]
        counts = Counter((r.client, r.verb, r.resource) for r in w.requests)
        if not counts:
            lines.append("- none")
        for (client, verb, resource), n in sorted(counts.items(), key=lambda kv: -kv[1]):
            lines.append(f"- {client} `{verb} {resource}`: {w.per_minute(n):.1f}")
    if windows:
        opened = sorted(
            f"{c} {r}" + (f" x{n}" if n > 1 else "")
            for (c, r), n in windows[-1].open_watches.items()
        )
        lines += ["", f"Watches open at the end: {', '.join(opened)}."]
    for w in windows:
        if w.instance_apps:
            lines += [
                "",
                f"ServeInstance `status.applications` after the {w.label}-application window "
                f"(only `one` exists then): {', '.join(w.instance_apps)}.",
            ]
    return [*lines, *write_samples(windows), ""]


def write_samples(windows: list[IdleWindow]) -> list[str]:
    """One body per written resource while idle: shows what the operator keeps writing."""
    seen: dict[str, bytes] = {}
    for w in windows:
        for r in w.others():
            if r.body and r.resource not in seen:
                seen[r.resource] = r.body
    if not seen:
        return []
    lines = ["", "One request body per resource written while idle (first 600 bytes):", ""]
    for resource, body in seen.items():
        text = body.decode(errors="replace")[:600]
        lines += [f"- `{resource}`:", "", "  ```", f"  {text}", "  ```"]
    return lines


def rss_section(rss: dict[str, float], many: ManyApps | None) -> list[str]:
    lines = [
        "## (b) Operator RSS",
        "",
        "`VmRSS` of the operator process (`python -m kubeserve.cli operator`), read from",
        "`/proc/<pid>/status` once the applications reached a steady status.",
        "",
        "| applications | RSS (MiB) |",
        "|---|---|",
    ]
    lines += [f"| {label} | {value:.1f} |" for label, value in rss.items()]
    if many is None:
        return [*lines, ""]
    load = ", ".join(f"{v:.1f}" for v in many.loadavg)
    lines += [
        "",
        f"The {many.count} applications (plus the one above) are `e2e_probe:app` with",
        f"{many.replicas or 'no'} replica pods each"
        + (" (autoscaling, minReplicas 0)" if not many.replicas else "")
        + " and their own route prefixes, under the one HeadOnly ServeInstance: each has a real",
        "build Job, Deployment, Service and status written by the operator. All",
        f"{many.count} were created back to back (one POST each); after",
        f"{many.seconds_to_steady:.0f} s their statuses were {dict(many.statuses)}, with",
        f"{many.pods_running} replica pods Running. Load average then: {load} on",
        f"{os.cpu_count()} CPUs (replica pods, control plane and operator share this machine).",
    ]
    for status, message in many.messages.items():
        lines += ["", f"- e.g. {status}: {message[:500]}"]
    return [*lines, ""]


def write_report(
    samples: list[ReadySamples],
    windows: list[IdleWindow],
    rss: dict[str, float],
    many: ManyApps | None,
    load_start: tuple[float, float, float],
    plane: ControlPlane,
) -> str:
    info = machine_info()
    version = plane.kubectl("version", "-o", "yaml", check=False).stdout
    server = (yaml.safe_load(version) or {}).get("serverVersion", {}).get("gitVersion", "?")
    lines = [
        "# kubeserve operator benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        *(f"- {k}: {v}" for k, v in info.items()),
        f"- control plane: test cluster of `tests/support/k8s_control_plane.py`, "
        f"kube-apiserver {server}, pods in containerd on one real node",
        f"- load average at start: {', '.join(f'{v:.1f}' for v in load_start)} "
        "(other work on this machine is not stopped)",
        "- rerun: `make bench-operator` (or `.venv/bin/python benchmarks/operator_bench.py`)",
        "",
        *ready_section(samples),
        *idle_section(windows),
        *rss_section(rss, many),
    ]
    text = "\n".join(lines)
    RESULTS.write_text(text)
    return text


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def operator_behind_proxy(plane: ControlPlane) -> Iterator[tuple[OperatorProcess, CountingProxy]]:
    proxy = CountingProxy(plane.server, plane.ca_file, plane.token)
    proxy.start()
    kubeconfig = proxy_kubeconfig(
        plane.work_dir / "bench-operator.kubeconfig", proxy.port, plane.token
    )
    op = OperatorProcess(plane, NAMESPACE, LOG, kubeconfig=kubeconfig)
    try:
        op.start()
        yield op, proxy
    finally:
        op.stop()
        proxy.stop()


def run(args: argparse.Namespace) -> str:
    bin_dir = find_node_bin_dir()
    missing = node_missing(bin_dir)
    if missing is not None:
        raise SystemExit(missing)
    assert bin_dir is not None
    load_start = os.getloadavg()
    with start_node_cluster(bin_dir) as plane:
        install_crds(plane)
        plane.add_namespace(NAMESPACE)
        with operator_behind_proxy(plane) as (op, proxy):
            time.sleep(args.settle)
            rss = {"0": op.rss_mib()}
            windows = [measure_idle(proxy, "0", 0, args.window)]
            plane.apply(instance())
            wait_ready(plane, "serveinstances", "default", 120)
            samples = []
            for import_path in args.apps:
                print(f"(a) create -> Ready: {import_path}", flush=True)
                samples.append(measure_create_to_ready(plane, import_path, args.runs, 180))
            print("(c)/(b) one application", flush=True)
            plane.apply(application("one", "e2e_probe:app", routePrefix="/one"))
            wait_ready(plane, "serveapplications", "one", 180)
            windows.append(measure_idle(proxy, "1", args.settle, args.window))
            windows[-1].instance_apps = instance_applications(plane)
            rss["1"] = op.rss_mib()
            many = None
            if args.many:
                print(f"(b) {args.many} applications", flush=True)
                try:
                    many = deploy_many(plane, op, args.many, args.many_timeout, args.many_replicas)
                    rss[f"{args.many + 1}"] = many.rss_mib
                    label = f"{args.many + 1}"
                    windows.append(measure_idle(proxy, label, args.settle, args.window))
                    rss[f"{args.many + 1}, after the idle window"] = op.rss_mib()
                except Exception as err:  # keep the figures measured so far
                    rss[f"{args.many} (failed: {type(err).__name__}: {err})"[:200]] = op.rss_mib()
        return write_report(samples, windows, rss, many, load_start, plane)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="create -> Ready runs per application")
    parser.add_argument(
        "--apps", nargs="+", default=["e2e_probe:app", "ks_composed_app:app"],
        help="import paths timed create -> Ready (from tests/apps)",
    )  # fmt: skip
    parser.add_argument("--many", type=int, default=100, help="applications for the RSS figure")
    parser.add_argument("--many-timeout", type=float, default=300)
    parser.add_argument(
        "--many-replicas",
        type=int,
        default=0,
        help="replica pods per application of the RSS figure (0: autoscaling from zero)",
    )
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    LOG.parent.mkdir(exist_ok=True)
    LOG.unlink(missing_ok=True)
    print(run(args))


if __name__ == "__main__":
    main()
