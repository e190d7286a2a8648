"""The native data path (experimental) beside the Python proxy and nginx, in the same run.

    make native && .venv/bin/python benchmarks/native.py

``KUBESERVE_DATA_PATH=native kubeserve start`` with the no-op app (1 replica): its proxy process
runs ``kubeserve-fastpath`` on the proxy port, the Python proxy behind it on a private loopback
port (the native process's ``--fallback``). So both paths front the very same replica, through the
real channel handshake and sealed frames: the native row loads the proxy port, the Python row loads
the Python proxy's private port directly. The nginx row is ``bench.py``'s: nginx in front of the
same replica code without the handshake (``plain_replica.py``, ``nginx.py``), and the direct row
that replica alone. Rows are measured in turns (``load.measure_together``); CPU microseconds per
request are read from /proc: "front" is the process in front (the native process, the Python
proxy, nginx's worker, the replica), "all" adds the replica (and, for the native row, the Python
proxy, which only records the native path's metrics once a second).

Writes ``results-native.json`` and ``results-native.md`` next to this file.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import load
import nginx
import plain_replica
from bench import noop_app, replica_pids
from systems import Kubeserve, free_port

HERE = Path(__file__).resolve().parent


def _fallback_port(native_pid: int) -> int:
    argv = Path(f"/proc/{native_pid}/cmdline").read_bytes().split(b"\0")
    return int(urlsplit("//" + argv[argv.index(b"--fallback") + 1].decode()).port or 0)


def main() -> int:
    os.environ["KUBESERVE_DATA_PATH"] = "native"  # inherited by kubeserve start and its proxy
    noop_path = "benchmarks.apps:noop"
    system = Kubeserve()
    system.start()
    try:
        system.put([noop_app(noop_path, 1)])
        system.wait_replicas("noop", "Noop", 1, 180)
        proxy_pid = system.process_pids()["proxy"]
        children = load.children(proxy_pid)
        if len(children) != 1:
            raise RuntimeError(f"the proxy runs no native process (children: {children})")
        native_pid = children[0]
        fallback = _fallback_port(native_pid)
        replica = replica_pids(system, "noop")
        rows: list[tuple[str, str, str, tuple[int, ...]]] = [
            (
                "no-op via native data path",
                "kubeserve-native",
                f"http://127.0.0.1:{system.proxy_port}/noop",
                (native_pid, proxy_pid, *replica),
            ),
            (
                "no-op via Python proxy",
                "kubeserve",
                f"http://127.0.0.1:{fallback}/noop",
                (proxy_pid, *replica),
            ),
        ]
        with (
            plain_replica.running(noop_path, "Noop", free_port()) as direct,
            nginx.reference_proxy(urlsplit(direct.url).port or 0) as reference,
        ):
            rows.append(("no-op, direct to replica", "kubeserve", direct.url, (direct.pid,)))
            if reference is not None:
                workers = tuple(load.children(nginx.master_pid(reference)))
                rows.append(
                    ("no-op via nginx", "nginx", f"{reference}noop", (*workers, direct.pid))
                )
            results = load.measure_together(rows)
    finally:
        system.stop()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (HERE / "results-native.json").write_text(
        json.dumps({"when": stamp, "results": [load.as_json(r) for r in results]}, indent=2) + "\n"
    )
    lines = [
        "# The native data path (experimental) beside the Python proxy and nginx",
        "",
        f"`benchmarks/native.py`, {stamp}, one machine, wrk -t{load.THREADS} "
        f"-c{load.CONNECTIONS}, {load.RUNS} runs of {load.DURATION_S} s in turns (median run).",
        "CPU us/request from /proc: *front* is the process in front; *all* adds the replica (and",
        "the Python proxy behind the native process for the native row).",
        "",
        "| setup | req/s | p50 ms | p99 ms | CPU us/req front (system) | CPU us/req all |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.median
        lines.append(
            f"| {r.setup} | {m.requests_per_s:,.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | "
            f"{r.cpu_us or 0:.1f} ({r.cpu_system_us or 0:.1f}) | {r.cpu_all_us or 0:.1f} |"
        )
    (HERE / "results-native.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
