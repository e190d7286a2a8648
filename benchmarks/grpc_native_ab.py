"""A/B of two ``kubeserve-fastpath`` binaries on the gRPC front: this tree's and another's (a
``main`` checkout's ``make native``), both run by this tree's Python code, so only the native
process differs. ghz (``grpc_proxy.ghz_load``) loads unary ``Echo`` and streamed ``Count`` calls
on each in turns; calls (messages) per second and the serving processes' CPU microseconds per
call (message), medians of the rounds.

    flock /tmp/bench.lock .venv/bin/python benchmarks/grpc_native_ab.py \\
        --base ../main/native/target/release/kubeserve-fastpath --ghz ~/go/bin/ghz --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from pathlib import Path

from grpc_proxy import ROOT, kubeserve_grpc, run_load  # (puts tests/ on the path)

BINARY_ENV = "KUBESERVE_FASTPATH_BINARY"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the other kubeserve-fastpath")
    parser.add_argument("--ghz", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    from support.grpc_protos import ensure_generated

    ensure_generated()
    with contextlib.ExitStack() as stack:
        os.environ.pop(BINARY_ENV, None)
        systems = {"new": stack.enter_context(kubeserve_grpc(ROOT, native=True))}
        os.environ[BINARY_ENV] = str(args.base.resolve())
        systems["base"] = stack.enter_context(kubeserve_grpc(ROOT, native=True))
        del os.environ[BINARY_ENV]
        rows: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for kind in ("stream", "unary"):
                for name, (port, serving) in systems.items():
                    value, us = run_load(
                        port, args.seconds, args.concurrency, kind, serving, args.ghz.resolve()
                    )
                    rows.setdefault(f"{kind} {name}", []).append((value, us))
                    print(f"{kind:7} {name:5} {value:9.0f}/s {us:6.1f} us", flush=True)
    for label, values in rows.items():
        rate = statistics.median(v for v, _ in values)
        cpu = statistics.median(u for _, u in values)
        print(f"{label}: median {rate:.0f}/s, {cpu:.1f} CPU us each")


if __name__ == "__main__":
    main()
