"""Autoscaling and overload, kubeserve vs Ray Serve 2.60 with the same configs, one at a time.

    .venv/bin/python benchmarks/autoscaling.py --ray-venv ~/.cache/kubeserve/ray-2.60.0

The applications are ``Scaled``, ``FromZero`` and ``Capped`` of ``benchmarks/ray_api_apps.py``
(Ray's API, deployed unchanged to both). Figures, each the median of ``--runs``:

* **scale up**: 16 clients start sending to ``Scaled`` (1 replica, ``target_ongoing_requests`` 2,
  ``upscale_delay_s`` 1); seconds until an answer comes from a second replica;
* **scale down**: the load stops; seconds until one replica runs again (``downscale_delay_s`` 5);
* **cold start**: ``FromZero`` has no replica (``min_replicas`` 0); seconds from one request to its
  answer, the first replica started for it;
* **overload**: ``Capped`` holds 2 requests and queues 4 (``max_queued_requests``); 24 clients (4x
  what it holds) send for 10 s: p50/p99 of the answered requests, the share of 503s and their
  median latency (a fast 503 is the point of the queue limit);
* **connections**: the no-op app at 16, 64 and 256 connections (wrk), loaded in turns (16, 64,
  256, then again) so that a change in the machine's load falls on every row alike; the 64 and
  256 rows as a share of the 16 row.

Writes ``results-autoscaling.json`` and ``results-autoscaling.md`` next to this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import load
from bench import noop_app
from systems import BENCH_DIR, Kubeserve, RayServe, ServeSystem, serve_bench_apps, wait_for


def _app(name: str, attribute: str) -> dict[str, str]:
    return {"name": name, "route_prefix": f"/{name}", "import_path": f"ray_api_apps:{attribute}"}


SCALED = _app("scaled", "scaled_app")
FROM_ZERO = _app("zero", "from_zero_app")
CAPPED = _app("capped", "capped_app")
CLIENTS = 16
OVERLOAD_CLIENTS = 24
OVERLOAD_S = 10.0
#: rounds of the connection rows, each round loading 16, 64 and 256 connections in turn
CONNECTION_ROUNDS = 5


async def _until_second_replica(url: str, timeout_s: float) -> float:
    """Seconds from starting ``CLIENTS`` looping clients to the first answer of a 2nd replica."""
    seen: set[str] = set()
    done = asyncio.Event()
    started = time.monotonic()
    found = 0.0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal found
        while not done.is_set():
            try:
                async with session.get(url) as response:
                    body = await response.text()
            except aiohttp.ClientError:
                continue
            if response.status == 200:
                seen.add(body)
                if len(seen) >= 2 and not done.is_set():
                    found = time.monotonic() - started
                    done.set()

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(CLIENTS)]
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        finally:
            done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return found


async def _one(url: str) -> float:
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status}")
    return time.monotonic() - started


async def _overload(url: str) -> dict[str, float]:
    ok: list[float] = []
    refused: list[float] = []
    other = 0
    deadline = time.monotonic() + OVERLOAD_S

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal other
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                async with session.get(url) as response:
                    await response.read()
                    status = response.status
            except aiohttp.ClientError:
                other += 1
                continue
            took = (time.monotonic() - started) * 1000
            if status == 200:
                ok.append(took)
            elif status == 503:
                refused.append(took)
            else:
                other += 1

    connector = aiohttp.TCPConnector(limit=OVERLOAD_CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(OVERLOAD_CLIENTS)))
    total = len(ok) + len(refused) + other
    ok.sort()
    return {
        "answered_per_s": len(ok) / OVERLOAD_S,
        "p50_ms": ok[len(ok) // 2] if ok else 0.0,
        "p99_ms": ok[int(len(ok) * 0.99)] if ok else 0.0,
        "share_503": len(refused) / total if total else 0.0,
        "median_503_ms": statistics.median(refused) if refused else 0.0,
        "other": float(other),
    }


def bench_system(system: ServeSystem, runs: int) -> dict[str, Any]:
    print(f"== {system.name}", flush=True)
    system.start()
    try:
        proxy = f"http://127.0.0.1:{system.proxy_port}"
        found: dict[str, Any] = {"scale_up_s": [], "scale_down_s": [], "cold_start_s": []}
        system.put([SCALED, FROM_ZERO, CAPPED, noop_app("ray_apps:noop", 1)])
        system.wait_replicas("scaled", "Scaled", 1, 300)
        system.wait_replicas("capped", "Capped", 1, 300)
        system.wait_replicas("noop", "Noop", 1, 300)
        for run in range(runs):
            up = asyncio.run(_until_second_replica(f"{proxy}/scaled", 120))
            stopped = time.monotonic()
            system.wait_replicas("scaled", "Scaled", 1, 180)
            down = time.monotonic() - stopped
            found["scale_up_s"].append(up)
            found["scale_down_s"].append(down)
            wait_for(lambda: not system.running_replicas("zero", "FromZero"), 180, 0.2)
            cold = asyncio.run(_one(f"{proxy}/zero"))
            found["cold_start_s"].append(cold)
            print(f"  run {run}: up {up:.2f} s, down {down:.2f} s, cold {cold:.2f} s", flush=True)
        found["overload"] = asyncio.run(_overload(f"{proxy}/capped"))
        print(f"  overload: {found['overload']}", flush=True)
        url = f"{proxy}/noop"
        counts = (16, 64, 256)
        rps: dict[int, list[float]] = {count: [] for count in counts}
        for count in counts:
            load.wrk(url, load.WARMUP_S, count)
        for _ in range(CONNECTION_ROUNDS):
            for count in counts:
                rps[count].append(load.wrk(url, load.DURATION_S, count).requests_per_s)
        connections = {str(count): statistics.median(rps[count]) for count in counts}
        found["connections"] = connections
        print(f"  connections: {connections}", flush=True)
        return found
    finally:
        system.stop()


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Autoscaling and overload: kubeserve vs Ray Serve 2.60",
        "",
        f"Machine: {results['machine']}. Apps: `Scaled`, `FromZero`, `Capped` of "
        "`benchmarks/ray_api_apps.py`, the same config on both. Rerun: `.venv/bin/python "
        "benchmarks/autoscaling.py --ray-venv ~/.cache/kubeserve/ray-2.60.0`.",
        "",
        "| system | scale up, s | scale down, s | cold start, s | overload: answered/s | "
        "p50 ms | p99 ms | 503s | median 503, ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in results["systems"].items():
        o = f["overload"]
        lines.append(
            f"| {name} | {_median(f['scale_up_s'])} | {_median(f['scale_down_s'])} | "
            f"{_median(f['cold_start_s'])} | {o['answered_per_s']:.0f} | {o['p50_ms']:.1f} | "
            f"{o['p99_ms']:.1f} | {o['share_503']:.1%} | {o['median_503_ms']:.1f} |"
        )
    lines += ["", "| system | 16 connections | 64 | 256 | 64 vs 16 | 256 vs 16 |"]
    lines += ["|---|---|---|---|---|---|"]
    for name, f in results["systems"].items():
        c = f["connections"]
        lines.append(
            f"| {name} | {c['16']:.0f} | {c['64']:.0f} | {c['256']:.0f} | "
            f"{c['64'] / c['16']:.0%} | {c['256'] / c['16']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray-venv", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["kubeserve", "ray"], default=None)
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": serve_bench_apps(),
        "systems": {},
    }
    systems: list[ServeSystem] = []
    if args.only in (None, "kubeserve"):
        systems.append(Kubeserve())
    if args.only in (None, "ray"):
        systems.append(RayServe(args.ray_venv))
    for system in systems:
        results["systems"][system.name] = bench_system(system, args.runs)
    results["machine"] += f", {os.getloadavg()[0]:.2f} at the end"
    (args.out / "results-autoscaling.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results-autoscaling.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
