"""gRPC through kubeserve's proxy vs a bare grpcio aio server serving the same servicer, and vs
Ray Serve 2.60's gRPC proxy serving the same application.

Rows, measured in turns (proxy, bare, ray, proxy, bare, ray...) so that all see the same machine,
medians reported: unary calls per second (``ksgrpc.Checks/Echo``) and streamed messages per second
(``ksgrpc.Checks/Count``, 50 messages a call). The client is one grpcio aio process with
``--concurrency`` calls in flight over one channel, the same for every row; the proxy row goes
client -> proxy -> replica (one replica of ``tests/apps/ks_grpc_checks_app.py:other``), the bare
row client -> one grpcio aio server process running the method's code itself, the ray row client
-> Ray's gRPC proxy actor -> one Ray replica of the same deployment (a local head started with
``--ray-venv``, token auth off, as :mod:`systems` starts it). CPU per call counts the serving
processes (proxy + replica; the bare server; Ray's proxy actor + replica actor).

``--ghz PATH`` measures every row a second time with ghz (a Go load generator, ``go install
github.com/bojand/ghz/cmd/ghz@v0.120.0``) as the client, same concurrency over one connection:
its client costs much less CPU per call than grpcio's, which on a small machine takes the cores
the servers would use (the ``ghz`` rows; the grpcio ones stay as they were).

``--native`` adds a ``native`` row: the proxy with the native data path
(``kubeserve start --data-path native``, ``make native``), whose ``kubeserve-fastpath`` process
owns the gRPC port and answers unary and server-streaming calls itself; CPU
per call counts the native process, the proxy and the replica.

``--baseline TREE`` adds a ``proxy@base`` row: the same proxy row served by another checkout's
code (a worktree of ``main``, say), measured in the same turns, for before/after figures; with
``--native``, a ``native@base`` row too (that checkout's ``make native`` binary).

    .venv/bin/python benchmarks/grpc_proxy.py --seconds 5 --rounds 3 --concurrency 32 \
        [--ray-venv ~/.cache/kubeserve/ray-2.60.0] [--baseline ../main]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "apps"), str(ROOT / "benchmarks")]

from support.common import free_port  # noqa: E402 - after the path is set

STREAM_LENGTH = 50
SERVICER = "ks_grpc_checks_pb2_grpc.add_ChecksServicer_to_server"


async def serve_bare(port: int) -> None:
    """The same methods as the ``other`` deployment and Checks.Count, served by grpcio itself."""
    import grpc.aio
    import ks_grpc_checks_pb2 as pb2
    import ks_grpc_checks_pb2_grpc as pb2_grpc

    class Bare(pb2_grpc.ChecksServicer):  # type: ignore[misc]
        async def Echo(self, ask: Any, context: Any) -> Any:
            return pb2.Answer(text=f"other:{ask.text}")

        async def Count(self, ask: Any, context: Any) -> Any:
            for i in range(ask.count):
                yield pb2.Answer(text=ask.text, index=i)

    server = grpc.aio.server()
    pb2_grpc.add_ChecksServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def load(port: int, seconds: float, concurrency: int, kind: str) -> dict[str, float]:
    """Calls (unary) or messages (stream) per second for ``seconds``, after a warm-up."""
    import grpc.aio
    import ks_grpc_checks_pb2 as pb2
    import ks_grpc_checks_pb2_grpc as pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb2_grpc.ChecksStub(channel)
        ask = pb2.Ask(text="x", count=STREAM_LENGTH)
        done = 0
        stop = 0.0

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                if kind == "unary":
                    await stub.Echo(ask)
                    done += 1
                else:
                    async for _ in stub.Count(ask):
                        done += 1

        stop = time.perf_counter() + 1.0  # warm-up
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        warm, done = done, 0
        started = time.perf_counter()
        stop = started + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"per_s": done / (time.perf_counter() - started), "all": warm + done}


def run_load(
    port: int,
    seconds: float,
    concurrency: int,
    kind: str,
    serving: list[int],
    ghz: Path | None = None,
) -> tuple[float, float]:
    """Calls (or messages) per second, and CPU microseconds the ``serving`` processes spent
    per call (or message); the client is grpcio's, or ``ghz``."""
    from load import cpu_s

    before = sum(cpu_s(pid) for pid in serving)
    if ghz is None:
        out = subprocess.run(
            [sys.executable, __file__, "--load", str(port), kind, str(seconds), str(concurrency)],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        result = ghz_load(ghz, port, seconds, concurrency, kind)
    spent = sum(cpu_s(pid) for pid in serving) - before
    return float(result["per_s"]), spent / result["all"] * 1e6


def ghz_load(ghz: Path, port: int, seconds: float, concurrency: int, kind: str) -> dict[str, float]:
    """As :func:`load`, with ghz as the client (one connection; its first second skipped by
    counting it apart, as the grpcio client's warm-up)."""
    method = "Echo" if kind == "unary" else "Count"
    count = 1 if kind == "unary" else STREAM_LENGTH
    data = json.dumps({"text": "x", "count": STREAM_LENGTH})
    runs = []
    for duration in (1.0, seconds):  # warm-up, then the measured run
        out = subprocess.run(
            [
                str(ghz),
                "--insecure",
                "--proto",
                str(ROOT / "tests" / "apps" / "protos" / "ks_grpc_checks.proto"),
                "--call",
                f"ksgrpc.Checks/{method}",
                "-d",
                data,
                "-c",
                str(concurrency),
                "--connections",
                "1",
                "-z",
                f"{duration}s",
                "-O",
                "json",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(out.stdout)
        ok = report["statusCodeDistribution"].get("OK", 0)
        runs.append((ok * count, ok * count / (report["total"] / 1e9)))
    return {"per_s": runs[1][1], "all": runs[0][0] + runs[1][0]}


@contextlib.contextmanager
def ray_grpc(venv: Path) -> Iterator[tuple[int, list[int]]]:
    """Ray Serve 2.60 serving ``ks_grpc_checks_app:other`` over its gRPC proxy: its port and the
    serving processes (the proxy actor and the replica)."""
    from systems import RayServe, http, pids_matching, wait_for

    ray = RayServe(venv)
    apps = str(ROOT / "tests" / "apps")
    ray.env["PYTHONPATH"] = os.pathsep.join((apps, ray.env["PYTHONPATH"]))
    grpc_port = free_port()
    try:
        ray.start()
        config = {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": ray.proxy_port},
            "grpc_options": {"port": grpc_port, "grpc_servicer_functions": [SERVICER]},
            "applications": [_APP],
        }
        http("PUT", f"{ray.api}/api/serve/applications/", config)
        ray.wait_replicas("other", "Other", 1, 300)
        serving = pids_matching("ray::ProxyActor")[:1] + pids_matching("ray::ServeReplica:other")
        wait_for(lambda: _answers(grpc_port), 60)
        yield grpc_port, serving
    finally:
        ray.stop()


def _answers(port: int) -> bool:
    import grpc
    import ks_grpc_checks_pb2 as pb2
    import ks_grpc_checks_pb2_grpc as pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            pb2_grpc.ChecksStub(channel).Echo(pb2.Ask(text="x"), timeout=5)
        except grpc.RpcError:
            return False
    return True


_APP = {
    "name": "other",
    "route_prefix": "/other",
    "import_path": "ks_grpc_checks_app:other",
    "deployments": [{"name": "Other", "max_ongoing_requests": 100}],
}


@contextlib.contextmanager
def kubeserve_grpc(code: Path, native: bool = False) -> Iterator[tuple[int, list[int]]]:
    """``kubeserve start`` (running ``code``'s ``operator/``; ``native``: with the native data
    path) serving the application over its gRPC proxy: the proxy's gRPC port and the serving
    processes (the proxy, its native process when any, and the replica)."""
    from support.kubeserve_start import running_kubeserve

    port = free_port()
    # this tree's proxy row is the Python proxy (native is the default); a baseline's, its default
    args = ("--data-path", "native" if native else "python") if code == ROOT else ()
    with (
        tempfile.TemporaryDirectory() as state,
        running_kubeserve(Path(state), code=code, args=args) as ks,
    ):
        options = {"port": port, "grpc_servicer_functions": [SERVICER]}
        status, body = ks.put([_APP], grpc_options=options)
        assert status == 200, body
        ks.wait_app("other", timeout_s=120)
        assert ks.proc is not None
        found = subprocess.run(
            ["pgrep", "-P", str(ks.proc.pid), "-f", "kubeserve.runtime.proxy"],
            capture_output=True,
            text=True,
        )
        proxy = int(found.stdout.split()[0])
        fastpath = subprocess.run(
            ["pgrep", "-P", str(proxy), "kubeserve-fastp"], capture_output=True, text=True
        )
        natives = [int(pid) for pid in fastpath.stdout.split()]
        assert natives or not native, "the proxy runs no kubeserve-fastpath (`make native`)"
        yield port, [proxy, *natives, *ks.replica_pids("other", "Other")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--ray-venv", type=Path, help="also measure Ray Serve 2.60's gRPC proxy")
    parser.add_argument("--baseline", type=Path, help="also measure this checkout's proxy")
    parser.add_argument(
        "--native", action="store_true", help="also measure the proxy with the native data path"
    )
    parser.add_argument("--ghz", type=Path, help="also measure every row with this ghz client")
    parser.add_argument("--serve-bare", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        asyncio.run(serve_bare(args.serve_bare))
        return
    if args.load:
        port, kind, seconds, concurrency = args.load
        print(json.dumps(asyncio.run(load(int(port), float(seconds), int(concurrency), kind))))
        return

    from support.grpc_protos import ensure_generated

    ensure_generated()
    bare_port = free_port()
    bare = subprocess.Popen(
        [sys.executable, __file__, "--serve-bare", str(bare_port)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests" / "apps")},
    )
    try:
        assert bare.stdout is not None and bare.stdout.readline().strip() == "ready"
        with contextlib.ExitStack() as stack:
            ports = {"proxy": 0, "bare": bare_port}
            serving = {"bare": [bare.pid]}
            ports["proxy"], serving["proxy"] = stack.enter_context(kubeserve_grpc(ROOT))
            if args.native:
                ports["native"], serving["native"] = stack.enter_context(
                    kubeserve_grpc(ROOT, native=True)
                )
            if args.baseline is not None:
                ports["proxy@base"], serving["proxy@base"] = stack.enter_context(
                    kubeserve_grpc(args.baseline.resolve())
                )
                if args.native:
                    ports["native@base"], serving["native@base"] = stack.enter_context(
                        kubeserve_grpc(args.baseline.resolve(), native=True)
                    )
            if args.ray_venv is not None:
                ports["ray"], serving["ray"] = stack.enter_context(ray_grpc(args.ray_venv))
            loads: dict[str, tuple[str, Path | None]] = {k: (k, None) for k in ("unary", "stream")}
            if args.ghz is not None:
                loads.update({f"{k}/ghz": (k, args.ghz.resolve()) for k in ("unary", "stream")})
            rows: dict[str, list[float]] = {}
            cpu: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for label, (kind, client) in loads.items():
                    for name in ports:
                        value, us = run_load(
                            ports[name], args.seconds, args.concurrency, kind, serving[name], client
                        )
                        rows.setdefault(f"{label} {name}", []).append(value)
                        cpu.setdefault(f"{label} {name}", []).append(us)
                        shown = f"{label:10} {name:10} {value:9.0f}/s {us:7.0f} CPU us each"
                        print(shown, flush=True)
    finally:
        bare.terminate()
        bare.wait()
    medians = {name: statistics.median(values) for name, values in rows.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    print(json.dumps({"medians_per_s": medians, "cpu_us_each": cpu_medians, "runs": rows}))
    for kind in loads:
        ratio = medians[f"{kind} proxy"] / medians[f"{kind} bare"]
        print(
            f"{kind}: proxy {medians[f'{kind} proxy']:.0f}/s = {ratio:.0%} of bare grpcio; "
            f"serving CPU per call {cpu_medians[f'{kind} proxy']:.0f} us (proxy + replica) vs "
            f"{cpu_medians[f'{kind} bare']:.0f} us (bare)"
        )
        if f"{kind} native" in medians:
            native = medians[f"{kind} native"]
            print(
                f"{kind}: native {native:.0f}/s = {native / medians[f'{kind} bare']:.0%} of bare "
                f"grpcio, {native / medians[f'{kind} proxy']:.1f}x the Python proxy; serving CPU "
                f"per call {cpu_medians[f'{kind} native']:.0f} us (native + proxy + replica)"
                + (
                    f"; {native / medians[f'{kind} ray']:.1f}x Ray's gRPC proxy"
                    if f"{kind} ray" in medians
                    else ""
                )
            )
        if f"{kind} proxy@base" in medians:
            print(
                f"{kind}: proxy@base {medians[f'{kind} proxy@base']:.0f}/s, "
                f"{cpu_medians[f'{kind} proxy@base']:.0f} us CPU each"
            )
        if f"{kind} native@base" in medians and f"{kind} native" in medians:
            base = medians[f"{kind} native@base"]
            print(
                f"{kind}: native@base {base:.0f}/s, "
                f"{cpu_medians[f'{kind} native@base']:.0f} us CPU each; native/native@base "
                f"{medians[f'{kind} native'] / base:.2f}"
            )
        if f"{kind} ray" in medians:
            print(
                f"{kind}: kubeserve {medians[f'{kind} proxy'] / medians[f'{kind} ray']:.1f}x "
                f"Ray Serve 2.60's gRPC proxy ({medians[f'{kind} ray']:.0f}/s, "
                f"{cpu_medians[f'{kind} ray']:.0f} us CPU each)"
            )


if __name__ == "__main__":
    main()
