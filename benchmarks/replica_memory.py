"""Resident memory of a real replica and of the proxy after load, and what their imports cost.

    .venv/bin/python benchmarks/replica_memory.py [TREE ...] [--starts 3] [--seconds 3]
        [--data-paths native,python] [--env NAME=VALUE ...] [--no-imports] [--source]

Each tree (default: this checkout; e.g. ``git worktree add /tmp/ks-before main``, then ``make
venv`` in it) is first given its bytecode (``make bytecode``: ``compileall`` of ``operator/
kubeserve`` and ``benchmarks``), as an installed wheel has it; ``--source`` skips that (with
``PYTHONDONTWRITEBYTECODE`` set, every process then compiles kubeserve at its start).

1. **After load.** ``--starts`` times, the trees and the proxy's data paths (``--data-paths``:
   the native one, the default, where the Python proxy runs ``kubeserve-fastpath`` in front of
   it, and ``--data-path python``, the Python proxy alone) in turns: ``kubeserve start`` of the
   tree with the applications ``noop`` (a plain method, Ray's default: a worker thread per call) and
   ``async_noop`` of ``benchmarks/compare_apps.py``, each loaded through the proxy with
   ``wrk -t1 -c16`` for ``--seconds``; then ``VmRSS``, ``RssAnon`` and ``RssFile`` are read from
   ``/proc/PID/status`` of the Python proxy, its ``kubeserve-fastpath`` child (the native data
   path) and each replica. Medians over the starts are printed. With ``--env``, each tree is
   also measured (in the same turns) with those variables in ``kubeserve start``'s environment,
   which its proxy and replicas inherit (glibc's ``MALLOC_*_THRESHOLD_``, say).
2. **Imports.** In a fresh interpreter of ``TREE``, the modules a replica of ``noop`` loads
   (``kubeserve.runtime.replica.command``, the build module and the application), group by group
   in the order a replica imports them, with the RSS each group adds. A group's figure depends
   on what came before it (a module shared by two groups counts in the first), so the order is
   fixed: the interpreter, asyncio (with ssl and concurrent.futures, which it imports), uvloop and
   httptools, then kubeserve's modules. ``sys.modules`` of the replica is what
   ``tests/runtime/test_replica_memory.py`` pins down. Then the same for the proxy
   (``kubeserve.runtime.proxy.command``, :data:`PROXY_GROUPS`), whose ``sys.modules``
   ``tests/runtime/test_proxy_memory.py`` pins down.

Run it under ``flock /tmp/bench.lock`` so that two benchmarks do not measure each other.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from compare_trees import tree_kubeserve

HERE = Path(__file__).resolve().parent
APPS = ("noop", "async_noop")
#: (as ``kubeserve.runtime.fastpath.DATA_PATH_ENV``; this script imports nothing of a tree)
DATA_PATH_ENV = "KUBESERVE_DATA_PATH"

#: The groups of the import breakdown, in the order a replica imports them; each a list of
#: modules (a module of the tree that lacks one is skipped).
GROUPS: list[tuple[str, list[str]]] = [
    ("asyncio (with ssl, socket, concurrent.futures, inspect)", ["asyncio"]),
    ("uvloop, httptools", ["uvloop", "httptools"]),
    ("argparse, json, logging", ["argparse", "json", "logging"]),
    ("kubeserve.runtime.channel (hmac, hashlib, sealing)", ["kubeserve.runtime.channel"]),
    ("kubeserve.runtime.logs (+ kubeserve.sdk.context)", ["kubeserve.runtime.logs"]),
    ("kubeserve.runtime.wire", ["kubeserve.runtime.wire"]),
    ("kubeserve.runtime.build + kubeserve.sdk", ["kubeserve.runtime.build"]),
    (
        "metrics (kubeserve.runtime.metrics, prometheus text)",
        ["kubeserve.runtime.metrics_listener"],
    ),
    ("replica HTTP server (replica.http)", ["kubeserve.runtime.replica.http"]),
    ("replica control, state, user code", ["kubeserve.runtime.replica.control"]),
    ("replica ingress (+ ASGI, streaming types)", ["kubeserve.runtime.replica.ingress"]),
    ("the rest of the replica command", ["kubeserve.runtime.replica.command"]),
    ("the application (benchmarks.apps)", ["benchmarks.apps"]),
]

#: The groups of the proxy's import breakdown, in the order the proxy command imports them
#: (uvloop last: only a proxy on the Python data path runs on it).
PROXY_GROUPS: list[tuple[str, list[str]]] = [
    ("asyncio (with ssl, socket, concurrent.futures, inspect)", ["asyncio"]),
    ("httptools", ["httptools"]),
    ("argparse, json, logging", ["argparse", "json", "logging"]),
    ("kubeserve.runtime.channel (hmac, hashlib, sealing, http1)", ["kubeserve.runtime.channel"]),
    ("kubeserve.runtime.logs (+ kubeserve.sdk.context)", ["kubeserve.runtime.logs"]),
    ("command line, limits, tracing (off)", [
        "kubeserve.runtime.command_line", "kubeserve.runtime.limits", "kubeserve.runtime.tracing",
    ]),
    ("discovery, wire (no urllib.parse: see the README)", ["kubeserve.runtime.discovery"]),
    ("the native data path's supervisor (fastpath, tls)", ["kubeserve.runtime.fastpath"]),
    ("router, load reports, metrics", [
        "kubeserve.runtime.load_report", "kubeserve.runtime.metrics_listener",
    ]),
    ("the Python HTTP data path (client, exchange, upstream, tunnel, TLS stream)", [
        "kubeserve.runtime.proxy.client", "kubeserve.runtime.proxy.state",
        "kubeserve.runtime.tls_stream",
    ]),
    ("the rest of the proxy command (server, command)", ["kubeserve.runtime.proxy.command"]),
    ("uvloop (the Python data path only)", ["uvloop"]),
]  # fmt: skip

_STEPS = r"""
import importlib, json, sys
def status():
    out = {}
    for line in open('/proc/self/status'):
        key, _, value = line.partition(':')
        if key in ('VmRSS', 'RssAnon', 'RssFile'):
            out[key] = int(value.split()[0]) / 1024
    return out
groups = json.loads(sys.argv[1])
rows = [('the interpreter', status(), len(sys.modules))]
for name, modules in groups:
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not (exc.name or '').startswith(('kubeserve', 'benchmarks')):
                raise
    rows.append((name, status(), len(sys.modules)))
print(json.dumps(rows))
"""


def proc_status(pid: int) -> dict[str, float]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of ``pid`` in MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def after_load(
    tree: Path, seconds: int, data_path: str, env: dict[str, str] | None = None
) -> dict[str, dict[str, float]]:
    """One ``kubeserve start`` of ``tree`` with its proxy on ``data_path`` (and ``env`` in its
    environment): each process's memory after the load."""
    os.environ[DATA_PATH_ENV] = data_path  # kubeserve start passes it to its proxy
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        return _after_load(tree, seconds)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _after_load(tree: Path, seconds: int) -> dict[str, dict[str, float]]:
    data_path = os.environ[DATA_PATH_ENV]
    with tree_kubeserve(tree, list(APPS), "memory", with_nginx=False) as setups:
        for app in APPS:
            subprocess.run(
                ["wrk", "-t1", "-c16", f"-d{seconds}s", setups[f"{app} via proxy"].url],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        # a row's processes: the proxy's children (kubeserve-fastpath), the proxy, the replica
        *native, proxy, _ = setups[f"{APPS[0]} via proxy"].pids
        found = {"proxy (Python)": proc_status(proxy)}
        for pid in native:
            found["proxy's kubeserve-fastpath"] = proc_status(pid)
        if data_path == "native" and not native:
            raise SystemExit(f"{tree}: the proxy runs no kubeserve-fastpath (make native there)")
        found["proxy, all processes"] = {
            key: sum(proc_status(pid)[key] for pid in (proxy, *native))
            for key in found["proxy (Python)"]
        }
        for app in APPS:
            found[f"replica {app}"] = proc_status(setups[f"{app} via proxy"].pids[-1])
        return found


def compile_tree(tree: Path) -> None:
    python = str(tree / ".venv" / "bin" / "python")
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j0", "operator/kubeserve", "benchmarks"],
        cwd=tree, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def imports(
    tree: Path, groups: list[tuple[str, list[str]]]
) -> list[tuple[str, dict[str, float], int]]:
    python = str(tree / ".venv" / "bin" / "python")
    env = {"PYTHONPATH": f"{tree}:{tree / 'operator'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [python, "-c", _STEPS, json.dumps(groups)],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return [tuple(row) for row in json.loads(out.stdout)]  # type: ignore[misc]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", default=[str(HERE.parent)])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument(
        "--data-paths", default="native,python", help="the proxy's data paths to measure, in turns"
    )
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE: also measure with it, in turns"
    )
    parser.add_argument("--no-imports", action="store_true")
    parser.add_argument("--source", action="store_true", help="do not compile the trees first")
    args = parser.parse_args()
    extra = dict(item.partition("=")[::2] for item in args.env)
    variants = [("", {})] + ([(f", with {' '.join(args.env)}", extra)] if extra else [])
    trees = [Path(tree).resolve() for tree in args.trees]
    if not args.source:
        for tree in trees:
            compile_tree(tree)
    paths = args.data_paths.split(",")
    runs: dict[tuple[Path, str, str], list[dict[str, dict[str, float]]]] = {
        (tree, path, name): [] for tree in trees for path in paths for name, _ in variants
    }
    for _ in range(args.starts):
        for tree in trees:
            for path in paths:
                for name, env in variants:
                    runs[tree, path, name].append(after_load(tree, args.seconds, path, env))
    for tree in trees:
        for path in paths:
            for name, _ in variants:
                report(tree, path + name, runs[tree, path, name])
        if not args.no_imports:
            report_imports(tree, "a replica", GROUPS)
            report_imports(tree, "the proxy", PROXY_GROUPS)
    return 0


def report(tree: Path, data_path: str, runs: list[dict[str, dict[str, float]]]) -> None:
    print(f"## {tree}, {data_path} data path: after load, medians of {len(runs)} starts (MiB)\n")
    print("| process | VmRSS | RssAnon | RssFile | each start (VmRSS) |\n|---|---|---|---|---|")
    for name in runs[0]:
        values = {key: statistics.median(run[name][key] for run in runs) for key in runs[0][name]}
        each = ", ".join(f"{run[name]['VmRSS']:.1f}" for run in runs)
        print(f"| {name} | {values['VmRSS']:.1f} | {values['RssAnon']:.1f} |"
              f" {values['RssFile']:.1f} | {each} |")  # fmt: skip
    print()


def report_imports(tree: Path, what: str, groups: list[tuple[str, list[str]]]) -> None:
    rows = imports(tree, groups)
    print(f"## {tree}: what {what}'s imports cost (MiB of RSS each group adds)\n")
    print("| group | +VmRSS | +RssAnon | +RssFile | +modules |\n|---|---|---|---|---|")
    name, first, count = rows[0]
    print(f"| {name} | {first['VmRSS']:.1f} | {first['RssAnon']:.1f} |"
          f" {first['RssFile']:.1f} | {count} |")  # fmt: skip
    for (_, before, n0), (name, after, n1) in itertools.pairwise(rows):
        delta = {key: after[key] - before[key] for key in after}
        print(f"| {name} | {delta['VmRSS']:.2f} | {delta['RssAnon']:.2f} |"
              f" {delta['RssFile']:.2f} | {n1 - n0} |")  # fmt: skip
    last = rows[-1][1]
    print(f"| **all imports** | {last['VmRSS']:.1f} | {last['RssAnon']:.1f} |"
          f" {last['RssFile']:.1f} | {rows[-1][2]} |\n")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
