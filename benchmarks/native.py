"""The native data path (the default) beside the Python proxy and nginx, in the same run.

    make native && .venv/bin/python benchmarks/native.py

``KUBESERVE_DATA_PATH=native kubeserve start`` with the no-op app (1 replica): its proxy process
runs ``kubeserve-fastpath`` on the proxy port (the Python proxy behind it on a private unix
socket), the native row loads that port; the Python row loads a second ``kubeserve start`` with the
Python data path and its own replica of the same app (both through the real channel handshake and
sealed frames). The nginx row is ``bench.py``'s: nginx in front of the
same replica code without the handshake (``plain_replica.py``, ``nginx.py``), and the direct row
that replica alone. Rows are measured in turns (``load.measure_together``); CPU microseconds per
request are read from /proc: "front" is the process in front (the native process, the Python
proxy, nginx's worker, the replica), "all" adds the replica (and, for the native row, the Python
proxy, which only records the native path's metrics once a second).

Writes ``results-native.json`` and ``results-native.md`` next to this file.

    .venv/bin/python benchmarks/native.py --https

HTTPS instead, same P-256 certificate everywhere (``tls.py``'s setup): the native data path
terminating TLS (``kubeserve start --data-path native`` with ``http_options.ssl_*``), the Python
proxy terminating TLS (a second ``kubeserve start``, Python data path) and nginx terminating TLS
(one worker, ``tls.nginx_tls``) in front of a plain replica, all three serving the same no-op
code. Each with keep-alive connections and with ``Connection: close`` (a full handshake per
request, no session reuse), runs in turns; CPU us/req of the front process (the native process,
the Python proxy, nginx's worker). Writes ``results-native-tls.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import load
import nginx
import plain_replica
from bench import noop_app, replica_pids
from systems import Kubeserve, free_port
from tls import APP, NEW_CONNECTION, kubeserve, nginx_tls

from support.tls_certs import Authority

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--https", action="store_true", help="the HTTPS rows (see above)")
    parser.add_argument("--runs", type=int, default=load.RUNS)
    parser.add_argument("--seconds", type=int, default=load.DURATION_S)
    args = parser.parse_args()
    if args.https:
        return https(args.runs, args.seconds)
    return plain()


def https(runs: int, seconds: int) -> int:
    """The HTTPS rows: native, Python proxy and nginx terminating TLS, in turns."""
    os.environ.pop("KUBESERVE_DATA_PATH", None)
    with (
        tempfile.TemporaryDirectory(prefix="kubeserve-bench-native-tls-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        pair = Authority(Path(tmp) / "ca").issue("server")
        native_url, native_proxy = stack.enter_context(
            kubeserve(Path(tmp) / "native", pair, ("--data-path", "native"))
        )
        (native_pid,) = load.children(native_proxy)
        python_url, python_proxy = stack.enter_context(
            kubeserve(Path(tmp) / "python", pair, ("--data-path", "python"))
        )
        replica = stack.enter_context(
            plain_replica.running(APP["import_path"], "AsyncNoop", free_port())
        )
        nginx_url, worker = stack.enter_context(
            nginx_tls(int(replica.url.rsplit(":", 1)[1].strip("/")), pair)
        )
        fronts = {"native data path": (native_url, native_pid), "Python proxy": (python_url,
                  python_proxy), "nginx": (nginx_url, worker)}  # fmt: skip
        rows = {
            f"{name} https {kind}": (url, headers, pid)
            for kind, headers in (("keep-alive", ()), ("new connections", NEW_CONNECTION))
            for name, (url, pid) in fronts.items()
        }
        measured: dict[str, list[load.Run]] = {name: [] for name in rows}
        for url, headers, _ in rows.values():
            load.wrk(url, load.WARMUP_S, headers=headers)
        for _ in range(runs):
            for name, (url, headers, pid) in rows.items():
                measured[name].append(load.wrk(url, seconds, headers=headers, pids=(pid,)))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    medians = {
        name: {
            "requests_per_s": statistics.median(r.requests_per_s for r in its),
            "p99_ms": statistics.median(r.p99_ms for r in its),
            "cpu_us": statistics.median(r.cpu_us or 0.0 for r in its),
            "cpu_system_us": statistics.median(r.cpu_system_us or 0.0 for r in its),
            "errors": sum(r.errors for r in its),
            "runs": [r.requests_per_s for r in its],
        }
        for name, its in measured.items()
    }
    (HERE / "results-native-tls.json").write_text(
        json.dumps({"when": stamp, "results": medians}, indent=2) + "\n"
    )
    lines = [
        "# HTTPS: the native data path beside the Python proxy and nginx terminating TLS",
        "",
        f"`benchmarks/native.py --https`, {stamp}, one machine, wrk -t{load.THREADS} "
        f"-c{load.CONNECTIONS}, {runs} runs of {seconds} s in turns (medians), a P-256",
        "certificate; *new connections*: `Connection: close`, a full handshake per request.",
        "CPU us/request from /proc of the front process (native process, Python proxy, nginx's",
        "worker).",
        "",
        "| row | req/s | p99 ms | CPU us/req front (system) | errors |",
        "|---|---|---|---|---|",
    ]
    for name, m in medians.items():
        lines.append(
            f"| {name} | {m['requests_per_s']:,.0f} | {m['p99_ms']:.2f} | "
            f"{m['cpu_us']:.1f} ({m['cpu_system_us']:.1f}) | {m['errors']} |"
        )
    (HERE / "results-native-tls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def plain() -> int:
    noop_path = "benchmarks.apps:noop"
    # the Python proxy's row: a kubeserve start of its own (the Python proxy behind the native
    # process listens on a private unix socket, which no load generator here reaches)
    os.environ["KUBESERVE_DATA_PATH"] = "python"
    python_system = Kubeserve()
    python_system.start()
    os.environ["KUBESERVE_DATA_PATH"] = "native"  # inherited by kubeserve start and its proxy
    system = Kubeserve()
    try:
        system.start()
        for each in (python_system, system):
            each.put([noop_app(noop_path, 1)])
            each.wait_replicas("noop", "Noop", 1, 180)
        proxy_pid = system.process_pids()["proxy"]
        children = load.children(proxy_pid)
        if len(children) != 1:
            raise RuntimeError(f"the proxy runs no native process (children: {children})")
        native_pid = children[0]
        rows: list[tuple[str, str, str, tuple[int, ...]]] = [
            (
                "no-op via native data path",
                "kubeserve-native",
                f"http://127.0.0.1:{system.proxy_port}/noop",
                (native_pid, proxy_pid, *replica_pids(system, "noop")),
            ),
            (
                "no-op via Python proxy",
                "kubeserve",
                f"http://127.0.0.1:{python_system.proxy_port}/noop",
                (python_system.process_pids()["proxy"], *replica_pids(python_system, "noop")),
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
        python_system.stop()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (HERE / "results-native.json").write_text(
        json.dumps({"when": stamp, "results": [load.as_json(r) for r in results]}, indent=2) + "\n"
    )
    lines = [
        "# The native data path (the default) beside the Python proxy and nginx",
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
