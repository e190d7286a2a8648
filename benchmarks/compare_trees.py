"""The proxy's cost in two source trees, measured in turns: did a change slow the proxy down?

    .venv/bin/python benchmarks/compare_trees.py BEFORE_TREE AFTER_TREE [--runs 7] [--seconds 5]

Each tree (a checkout with its own ``.venv``, e.g. ``git worktree add /tmp/ks-before <commit>``
then ``make venv`` in it) runs its own ``kubeserve start`` with the no-op app (1 replica), both at
once. For each tree two URLs are loaded: the replica directly (the tree's
``benchmarks/plain_replica.py`` when it has one, i.e. once replicas require the data-plane
handshake; else the replica's own port from the controller's snapshot) and its proxy. Then wrk
runs them in turns, run 1 of each setup, run 2 of each..., so every setup sees the same background
load, and the table gives medians and the proxy/direct ratio per tree. The proxy is loaded twice:
without ``X-Request-Id`` (the proxy makes one up and splices it into the forwarded request) and
with one (forwarded verbatim).

Because req/s on a shared machine follow the background load, each run also reads the CPU time
(user + system, from /proc) the serving processes used, divided by the requests served: CPU
microseconds per request of the replica (direct rows) and of the proxy process (proxy rows). That
figure hardly depends on how busy the machine is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import load
from systems import free_port, wait_for

WITH_ID = ("X-Request-Id: 0123456789abcdef0123456789abcdef",)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


@contextlib.contextmanager
def tree_kubeserve(tree: Path) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """``kubeserve start`` of ``tree`` with the no-op app: (direct URL, the PID serving it) and
    (proxy URL, the proxy's PID)."""
    python = str(tree / ".venv" / "bin" / "python")
    api, proxy = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="kubeserve-compare-") as state:
        proc = subprocess.Popen(
            [python, "-m", "kubeserve.cli", "start", "--dashboard-port", str(api),
             "--http-host", "127.0.0.1", "--http-port", str(proxy), "--state-dir", state],
            cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        direct: subprocess.Popen[str] | None = None
        try:
            base = f"http://127.0.0.1:{api}"
            wait_for(lambda: bool(_get(f"{base}/api/ray/version")), 60)
            config = {
                "proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": proxy},
                "applications": [
                    {"name": "noop", "route_prefix": "/noop", "import_path": "benchmarks.apps:noop"}
                ],
            }
            request = urllib.request.Request(
                f"{base}/api/serve/applications/",
                data=json.dumps(config).encode(),
                method="PUT",
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=30).close()
            proxy_url = f"http://127.0.0.1:{proxy}/noop"
            wait_for(lambda: _get(proxy_url) == b"ok", 120, 0.1)
            details = json.loads(_get(f"{base}/api/serve/applications/"))
            proxy_pid = int(next(iter(details["proxies"].values()))["worker_id"])
            plain = tree / "benchmarks" / "plain_replica.py"
            if plain.exists():
                port = free_port()
                direct = subprocess.Popen(
                    [python, str(plain), "benchmarks.apps:noop", "Noop", str(port)],
                    cwd=tree, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                assert direct.stdout is not None and direct.stdout.readline().strip() == "ready"
                direct_url = f"http://127.0.0.1:{port}/"
                direct_pid = direct.pid
            else:  # before the handshake: the replica's own port, from discovery
                snapshot = json.loads(_get(f"{base}/-/snapshot?version=-1&timeout=0"))
                replica = snapshot["deployments"]["noop#Noop"]["replicas"][0]
                direct_url = f"http://127.0.0.1:{replica['port']}/"
                replicas = details["applications"]["noop"]["deployments"]["Noop"]["replicas"]
                direct_pid = int(replicas[0]["pid"])
            yield (direct_url, direct_pid), (proxy_url, proxy_pid)
        finally:
            if direct is not None:
                direct.terminate()
                direct.wait(10)
            proc.terminate()
            proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    with (
        tree_kubeserve(args.before.resolve()) as (before_direct, before_proxy),
        tree_kubeserve(args.after.resolve()) as (after_direct, after_proxy),
    ):
        setups = {
            ("before", "direct"): (*before_direct, ()),
            ("before", "proxy"): (*before_proxy, ()),
            ("before", "proxy, client id"): (*before_proxy, WITH_ID),
            ("after", "direct"): (*after_direct, ()),
            ("after", "proxy"): (*after_proxy, ()),
            ("after", "proxy, client id"): (*after_proxy, WITH_ID),
        }
        rps: dict[tuple[str, str], list[float]] = {key: [] for key in setups}
        cpu_us: dict[tuple[str, str], list[float]] = {key: [] for key in setups}
        for url, _, headers in setups.values():
            load.wrk(url, 2, headers=headers)  # warm-up
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        for run in range(args.runs):
            for key, (url, pid, headers) in setups.items():
                before = cpu_s(pid)
                result = load.wrk(url, args.seconds, headers=headers)
                used = cpu_s(pid) - before
                if result.errors:
                    print(f"  {key}: {result.errors} errors", flush=True)
                rps[key].append(result.requests_per_s)
                cpu_us[key].append(used * 1e6 / (result.requests_per_s * args.seconds))
            print(f"run {run + 1}/{args.runs} done", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    medians = {key: statistics.median(values) for key, values in rps.items()}
    cpu = {key: statistics.median(values) for key, values in cpu_us.items()}
    print(
        "\n| tree | setup | median req/s | vs direct (same tree) | CPU us/request "
        "(replica for direct, proxy process for proxy rows) | req/s of each run |"
    )
    print("|---|---|---|---|---|---|")
    for (tree, setup), median in medians.items():
        direct = medians[(tree, "direct")]
        runs = " ".join(f"{v:.0f}" for v in rps[(tree, setup)])
        print(
            f"| {tree} | {setup} | {median:.0f} | {median / direct:.1%} | "
            f"{cpu[(tree, setup)]:.1f} | {runs} |"
        )
    for setup in ("direct", "proxy", "proxy, client id"):
        ratio = medians[("after", setup)] / medians[("before", setup)]
        cost = cpu[("after", setup)] / cpu[("before", setup)]
        print(f"after / before, {setup}: req/s {ratio:.1%}, CPU per request {cost:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
