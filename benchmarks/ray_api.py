"""Ray Serve applications on kubeserve and on Ray Serve 2.60: FastAPI, streaming and batching.

    .venv/bin/python benchmarks/ray_api.py --ray-venv ~/.cache/kubeserve/ray-2.60.0 [--only ...]

The applications are ``benchmarks/ray_api_apps.py``, one file written against Ray's API, deployed
unchanged to both systems (``make bench`` runs this after ``bench.py``). Three figures:

* **FastAPI**: the same FastAPI app under uvicorn alone (one worker: the anchor), through kubeserve
  and through Ray Serve (one replica each). Each system is measured while it is the only one up
  (the other is stopped: an idle Ray cluster alone takes a good part of a core here), in turns
  with the anchor (run 1 of each, run 2 of each...), so that the system and its anchor see the
  same background; req/s and p50/p99, each system's share of its anchor's req/s, and kubeserve's
  req/s over Ray's.
* **Streaming**: an ingress returning a ``StreamingResponse`` over ``handle.options(stream=True)``
  to a generator deployment: time to the first chunk (of a one-chunk stream) and chunks per second
  of a ``--chunks`` long stream, through the proxy, the ingress and the handle.
* **Batching**: a "model" taking 20 ms per call (one call at a time) behind ``@serve.batch``
  (``max_batch_size=32``) or called per request, under 64 connections: req/s and the batched /
  unbatched ratio.

Writes ``results-ray-api.json`` and ``results-ray-api.md`` next to this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import load
from systems import (
    BENCH_DIR,
    Kubeserve,
    RayServe,
    ServeSystem,
    free_port,
    http,
    serve_bench_apps,
    wait_for,
)

RUNS = 5
STREAM_RUNS = 7
BATCH_CONNECTIONS = 64


def _app(name: str, attribute: str) -> dict[str, str]:
    return {"name": name, "route_prefix": f"/{name}", "import_path": f"ray_api_apps:{attribute}"}


FASTAPI = _app("fa", "fastapi_app")
STREAMING = _app("stream", "streaming_app")
BATCHED = _app("batched", "batched_app")
UNBATCHED = _app("unbatched", "unbatched_app")


class Uvicorn:
    """``uvicorn ray_api_apps:app`` from the Ray virtualenv (it has uvicorn, FastAPI and the
    ``ray`` package the module imports), one worker, on 127.0.0.1."""

    def __init__(self, ray_venv: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(ray_venv / "bin" / "python"), "-m", "uvicorn", "ray_api_apps:app",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
             "--no-access-log"],
            cwd=BENCH_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: bool(http("GET", f"{self.url}/hello", timeout=2)), 120, 0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def _one_stream(url: str) -> tuple[float, float, int]:
    """(seconds to the first body byte, seconds to the end, lines received) of one GET."""
    host, _, rest = url.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    reader, writer = await asyncio.open_connection(name, int(port))
    start = time.perf_counter()
    writer.write(f"GET /{rest} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{url}: {head[:80]!r}")
    first = 0.0
    body = bytearray()
    while chunk := await reader.read(65536):
        if not first:
            first = time.perf_counter() - start
        body += chunk
    total = time.perf_counter() - start
    writer.close()
    # chunked framing: count the payload's lines (each chunk of the app is "i\n")
    lines = sum(1 for line in bytes(body).split(b"\r\n") if line.endswith(b"\n") or line.isdigit())
    return first, total, lines


def streaming(proxy: str, chunks: int) -> dict[str, float]:
    first_chunk = []
    rate = []
    for _ in range(STREAM_RUNS):
        first, _, _ = asyncio.run(_one_stream(f"{proxy}/stream?n=1"))
        first_chunk.append(first * 1000)
        _, total, _ = asyncio.run(_one_stream(f"{proxy}/stream?n={chunks}"))
        rate.append(chunks / total)
    return {
        "first_chunk_ms": statistics.median(first_chunk),
        "chunks_per_s": statistics.median(rate),
        "chunks": chunks,
    }


def deploy(system: ServeSystem, *apps: dict[str, Any]) -> None:
    system.put(list(apps))
    wait_for(lambda: all(system.app_running(app["name"]) for app in apps), 300, 0.1)


def bench_system(system: ServeSystem, chunks: int) -> dict[str, Any]:
    print(f"== {system.name}", flush=True)
    system.start()
    try:
        proxy = f"http://127.0.0.1:{system.proxy_port}"
        deploy(system, FASTAPI, STREAMING, BATCHED, UNBATCHED)
        found: dict[str, Any] = {"fastapi_url": f"{proxy}/fa/hello?name=x"}
        found["streaming"] = streaming(proxy, chunks)
        print(f"  streaming: {found['streaming']}", flush=True)
        batch = {}
        for setup in ("batched", "unbatched"):
            url = f"{proxy}/{setup}?x=1"
            load.wrk(url, load.WARMUP_S, BATCH_CONNECTIONS)
            runs = [load.wrk(url, load.DURATION_S, BATCH_CONNECTIONS) for _ in range(3)]
            batch[setup] = {
                "requests_per_s": statistics.median(r.requests_per_s for r in runs),
                "p99_ms": statistics.median(r.p99_ms for r in runs),
                "errors": sum(r.errors for r in runs),
            }
        batch["ratio"] = batch["batched"]["requests_per_s"] / batch["unbatched"]["requests_per_s"]
        found["batching"] = batch
        print(f"  batching: {batch}", flush=True)
        return found
    except BaseException:
        system.stop()
        raise


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Ray Serve applications: kubeserve vs Ray Serve 2.60",
        "",
        f"Machine: {results['machine']}. Apps: `benchmarks/ray_api_apps.py`, deployed unchanged "
        "to both systems. Rerun: `.venv/bin/python benchmarks/ray_api.py --ray-venv "
        "~/.cache/kubeserve/ray-2.60.0`.",
        "",
        f"## FastAPI (wrk, {load.CONNECTIONS} connections, {RUNS} runs in turns with uvicorn "
        "alone, each system the only one up, medians)",
        "",
        "| system | req/s | p50 ms | p99 ms | uvicorn alone, same turns | share of uvicorn |",
        "|---|---|---|---|---|---|",
    ]
    fastapi = results["fastapi"]
    for name, row in fastapi.items():
        anchor = row["uvicorn_requests_per_s"]
        lines.append(
            f"| {name} | {row['requests_per_s']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
            f"{anchor:.0f} | {row['requests_per_s'] / anchor:.1%} |"
        )
    if {"kubeserve", "Ray Serve 2.60"} <= set(fastapi):
        ratio = fastapi["kubeserve"]["requests_per_s"] / fastapi["Ray Serve 2.60"]["requests_per_s"]
        lines += ["", f"kubeserve serves {ratio:.1f}x Ray's requests per second."]
    lines += ["", "## Streaming (proxy -> ingress -> streaming handle -> generator)", ""]
    lines += ["| system | first chunk, ms (median) | chunks/s (median) |", "|---|---|---|"]
    for name, figures in results["systems"].items():
        s = figures["streaming"]
        lines.append(f"| {name} | {s['first_chunk_ms']:.1f} | {s['chunks_per_s']:.0f} |")
    lines += ["", f"## Batching ({BATCH_CONNECTIONS} connections, 20 ms per model call)", ""]
    lines += ["| system | batched req/s | unbatched req/s | ratio | batched p99 ms |"]
    lines += ["|---|---|---|---|---|"]
    for name, figures in results["systems"].items():
        b = figures["batching"]
        lines.append(
            f"| {name} | {b['batched']['requests_per_s']:.0f} | "
            f"{b['unbatched']['requests_per_s']:.0f} | {b['ratio']:.1f}x | "
            f"{b['batched']['p99_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray-venv", type=Path, required=True)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": serve_bench_apps(),
        "systems": {},
    }
    systems: list[ServeSystem] = [Kubeserve(), RayServe(args.ray_venv)]
    uvicorn = Uvicorn(args.ray_venv)
    results["fastapi"] = {}
    try:
        for system in systems:  # one at a time: the other is not running
            figures = bench_system(system, args.chunks)
            try:
                url = figures.pop("fastapi_url")
                setups = [
                    ("FastAPI app", "uvicorn", f"{uvicorn.url}/hello?name=x"),
                    ("FastAPI app", system.name, url),
                ]
                anchor, row = load.measure_together(setups, RUNS)
            finally:
                system.stop()
            results["systems"][system.name] = figures
            results["fastapi"][system.name] = {
                "requests_per_s": row.requests_per_s,
                "p50_ms": row.median.p50_ms,
                "p99_ms": row.median.p99_ms,
                "errors": sum(run.errors for run in row.runs),
                "uvicorn_requests_per_s": anchor.requests_per_s,
            }
    finally:
        uvicorn.stop()
    results["machine"] += f", {os.getloadavg()[0]:.2f} at the end"
    (args.out / "results-ray-api.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results-ray-api.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
