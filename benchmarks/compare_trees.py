"""The data plane's cost in two source trees, measured in turns: did a change slow it down?

    .venv/bin/python benchmarks/compare_trees.py BEFORE_TREE AFTER_TREE [--runs 5] [--seconds 5]
        [--apps noop,async_noop,chain] [--json OUT]

Each tree (a checkout with its own ``.venv``, e.g. ``git worktree add /tmp/ks-before <commit>``
then ``make venv`` in it) runs its own ``kubeserve start`` with the applications of
``benchmarks/compare_apps.py`` (copied into a tree that lacks it), 1 replica each, both trees at
once:

* ``noop``: a plain method, Ray's default convention (a worker thread per call);
* ``async_noop``: the same as an ``async def``;
* ``chain``: an async ingress awaiting an async deployment through a handle.

For each tree and application the proxy is loaded (for ``noop`` also with a client
``X-Request-Id``, which the proxy forwards instead of making one up), and the no-op replicas
directly: the tree's ``benchmarks/plain_replica.py`` when it has one (replicas take authenticated
connections only), else the replica's own port from the controller's snapshot. With nginx
installed, nginx in front of the after tree's plain async replica is loaded too: the reference for
a protocol-level hop. Then wrk runs every setup in turns, run 1 of each, run 2 of each..., so all
see the same background load.

Because req/s on a shared machine follow the background load, each run also reads from /proc the
CPU time (user + system) the serving processes used, divided by the requests served: of the
process in front (the proxy's ``kubeserve-fastpath`` child on the native data path, else the
proxy; nginx's worker; or the replica for direct rows), and of all the
serving processes of the row (proxy and every replica of the application). Those figures hardly
depend on how busy the machine is; the table gives medians, and after/before ratios per setup.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import load
import nginx
from load import children, cpu_s
from systems import free_port, wait_for

HERE = Path(__file__).resolve().parent
APPS_MODULE = "compare_apps"
WITH_ID = ("X-Request-Id: 0123456789abcdef0123456789abcdef",)
#: application -> its ingress deployment (as in compare_apps.py)
INGRESS = {"noop": "Noop", "async_noop": "AsyncNoop", "chain": "Chain"}
SYNC_APPS = ("noop", "async_noop")  # those with a single no-op replica to load directly


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


@dataclass
class Setup:
    """One loaded URL: ``front`` serves it, ``pids`` are every serving process of the row."""

    url: str
    front: int
    pids: tuple[int, ...]
    headers: tuple[str, ...] = ()
    #: the Python proxy when it is not ``front`` (behind its kubeserve-fastpath child)
    behind: int | None = None
    rps: list[float] = field(default_factory=list)
    front_us: list[float] = field(default_factory=list)
    total_us: list[float] = field(default_factory=list)
    behind_us: list[float] = field(default_factory=list)


@contextlib.contextmanager
def _apps_module(tree: Path) -> Iterator[None]:
    """``benchmarks/compare_apps.py`` in ``tree`` for the block (copied there when missing)."""
    target = tree / "benchmarks" / f"{APPS_MODULE}.py"
    copied = not target.exists()
    if copied:
        shutil.copy(HERE / f"{APPS_MODULE}.py", target)
    try:
        yield
    finally:
        if copied:
            target.unlink()


@contextlib.contextmanager
def _plain_replica(tree: Path, app: str, deployment: str) -> Iterator[tuple[str, int] | None]:
    plain = tree / "benchmarks" / "plain_replica.py"
    if not plain.exists():
        yield None
        return
    port = free_port()
    proc = subprocess.Popen(
        [str(tree / ".venv" / "bin" / "python"), str(plain),
         f"benchmarks.{APPS_MODULE}:{app}", deployment, str(port)],
        cwd=tree, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}/", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def tree_kubeserve(
    tree: Path, apps: list[str], name: str, with_nginx: bool
) -> Iterator[dict[str, Setup]]:
    """``kubeserve start`` of ``tree`` with ``apps`` running: its setups, by row name."""
    python = str(tree / ".venv" / "bin" / "python")
    api, proxy = free_port(), free_port()
    with (
        _apps_module(tree),
        tempfile.TemporaryDirectory(prefix="kubeserve-compare-") as state,
        contextlib.ExitStack() as stack,
    ):
        proc = subprocess.Popen(
            [python, "-m", "kubeserve.cli", "start", "--dashboard-port", str(api),
             "--http-host", "127.0.0.1", "--http-port", str(proxy), "--state-dir", state],
            cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{api}"
            wait_for(lambda: bool(_get(f"{base}/api/ray/version")), 60)
            config = {
                "proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": proxy},
                "applications": [
                    {"name": app, "route_prefix": f"/{app}",
                     "import_path": f"benchmarks.{APPS_MODULE}:{app}"}
                    for app in apps
                ],
            }  # fmt: skip
            request = urllib.request.Request(
                f"{base}/api/serve/applications/",
                data=json.dumps(config).encode(),
                method="PUT",
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=30).close()
            for app in apps:
                wait_for(lambda app=app: _get(f"http://127.0.0.1:{proxy}/{app}") == b"ok", 180, 0.1)
            details = json.loads(_get(f"{base}/api/serve/applications/"))
            proxy_pid = int(next(iter(details["proxies"].values()))["worker_id"])
            setups: dict[str, Setup] = {}
            for app in apps:
                deployments = details["applications"][app]["deployments"]
                replicas = tuple(int(r["pid"]) for d in deployments.values() for r in d["replicas"])
                url = f"http://127.0.0.1:{proxy}/{app}"
                # the process in front: on the native data path the proxy's kubeserve-fastpath
                # child, else the proxy itself; the Python proxy counts among the row's processes
                front = (*children(proxy_pid), proxy_pid)
                pids = (*front, *replicas)
                behind = proxy_pid if front[0] != proxy_pid else None
                setups[f"{app} via proxy"] = Setup(url, front[0], pids, behind=behind)
                if app == "noop":
                    setups[f"{app} via proxy, client id"] = Setup(
                        url, front[0], pids, WITH_ID, behind
                    )
                if app not in SYNC_APPS:
                    continue
                plain = stack.enter_context(_plain_replica(tree, app, INGRESS[app]))
                if plain is None:  # before the handshake: the replica's own port
                    snapshot = json.loads(_get(f"{base}/-/snapshot?version=-1&timeout=0"))
                    replica = snapshot["deployments"][f"{app}#{INGRESS[app]}"]["replicas"][0]
                    plain = (f"http://127.0.0.1:{replica['port']}/", replicas[0])
                setups[f"{app} direct"] = Setup(plain[0], plain[1], (plain[1],))
                if with_nginx and app == "async_noop":
                    reference = stack.enter_context(
                        nginx.reference_proxy(int(plain[0].rsplit(":", 1)[1].strip("/")))
                    )
                    if reference is not None:
                        master = nginx.master_pid(reference)
                        workers = tuple(children(master))
                        setups[f"{app} via nginx"] = Setup(
                            reference, workers[0], (*workers, plain[1])
                        )
            yield setups
        finally:
            stack.close()
            proc.terminate()
            proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--apps", default="noop,async_noop,chain")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()
    apps = args.apps.split(",")
    with (
        tree_kubeserve(args.before.resolve(), apps, "before", False) as before,
        tree_kubeserve(args.after.resolve(), apps, "after", True) as after,
    ):
        setups = {("before", k): v for k, v in before.items()}
        setups |= {("after", k): v for k, v in after.items()}
        for setup in setups.values():
            load.wrk(setup.url, 2, headers=setup.headers)  # warm-up
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        for run in range(args.runs):
            for key, setup in setups.items():
                front = cpu_s(setup.front)
                total = sum(cpu_s(pid) for pid in setup.pids)
                behind = cpu_s(setup.behind) if setup.behind is not None else 0.0
                result = load.wrk(setup.url, args.seconds, headers=setup.headers)
                served = result.requests_per_s * args.seconds
                if result.errors:
                    print(f"  {key}: {result.errors} errors", flush=True)
                setup.rps.append(result.requests_per_s)
                setup.front_us.append((cpu_s(setup.front) - front) * 1e6 / served)
                setup.total_us.append(
                    (sum(cpu_s(pid) for pid in setup.pids) - total) * 1e6 / served
                )
                if setup.behind is not None:
                    setup.behind_us.append((cpu_s(setup.behind) - behind) * 1e6 / served)
            print(f"run {run + 1}/{args.runs} done", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    median = statistics.median
    print(
        "\n| tree | setup | median req/s | CPU us/request, front process | CPU us/request, "
        "Python proxy behind it | CPU us/request, all serving processes | req/s of each run |"
    )
    print("|---|---|---|---|---|---|---|")
    table = []
    for (tree, name), s in setups.items():
        row = {
            "tree": tree,
            "setup": name,
            "requests_per_s": median(s.rps),
            "front_cpu_us": median(s.front_us),
            "total_cpu_us": median(s.total_us),
            "behind_cpu_us": median(s.behind_us) if s.behind_us else None,
        }
        table.append(row)
        runs = " ".join(f"{v:.0f}" for v in s.rps)
        print(
            f"| {tree} | {name} | {row['requests_per_s']:.0f} | {row['front_cpu_us']:.1f} | "
            f"{'-' if not s.behind_us else f'{median(s.behind_us):.1f}'} | "
            f"{row['total_cpu_us']:.1f} | {runs} |"
        )
    print()
    for name in before:
        b, a = setups[("before", name)], setups[("after", name)]
        print(
            f"after / before, {name}: req/s {median(a.rps) / median(b.rps):.0%}, CPU per "
            f"request {median(a.front_us) / median(b.front_us):.0%} (front), "
            f"{median(a.total_us) / median(b.total_us):.0%} (all)"
            + (
                f", {median(a.behind_us) / median(b.behind_us):.0%} (Python proxy behind it)"
                if a.behind_us and b.behind_us
                else ""
            )
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
