"""CPU per request of a replica's accounting and access line, in-process: the tally's ``done()``
per request and the access log's write of its lines every 1,000 requests (as a replica's 0.1 s
flush under ~10k req/s), into a rotating log file, TEXT or JSON.

    .venv/bin/python benchmarks/tally_lines.py [--encoding TEXT|JSON] [--requests N] [--rounds N]

Run it in each tree to compare (the compiled tally, or the pure Python one with
``KUBESERVE_PURE_PYTHON=1``); ``time.process_time`` per request, best and median round.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from kubeserve.runtime import logs
from kubeserve.runtime.metrics import LATENCY_BUCKETS_MS
from kubeserve.runtime.replica.tally import new_tally

FLUSH_EVERY = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoding", default="TEXT", choices=["TEXT", "JSON"])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        handler = logs.RotatingLog(os.path.join(folder, "replica.log"), 0, 0)
        component = logs.ComponentLog("replica", "Echo", "Echo-1-abc", "app", "Echo")
        logs.configure(logs.LogSettings({"encoding": args.encoding}), component, handler)
        batched = logs.batched_access()
        assert batched is not None
        tally = new_tally(LATENCY_BUCKETS_MS)
        if hasattr(tally, "access_format"):  # (a tree before the tally formatted its lines)
            line_format = batched.native_format()
            tally.access_format(line_format["json"], line_format["component"])
        rounds = []
        for _ in range(args.rounds):
            started = time.process_time()
            for i in range(args.requests):
                tally.done(0.0, 0.0012, "/echo", "GET", "/echo", 200, "0123456789abcdef", "/echo")
                if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                    tally.take_metrics()
                    batched.write_tally(tally)
            rounds.append((time.process_time() - started) / args.requests * 1e6)
        handler.close()
    rounds.sort()
    print(
        f"{type(tally).__module__}.{type(tally).__name__}, {args.encoding}: CPU us per request "
        f"best {rounds[0]:.2f}, median {rounds[len(rounds) // 2]:.2f}"
    )


if __name__ == "__main__":
    main()
