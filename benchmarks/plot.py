"""``results.png`` from ``results.json``: req/s and p99 per setup, kubeserve next to Ray Serve.

Runs in the bench-only virtualenv (matplotlib), ``~/.cache/kubeserve/bench``, that ``make bench``
creates; the harness itself needs only the standard library.

    python benchmarks/plot.py results.json results.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: str, target: str) -> None:
    with open(source) as f:
        results = json.load(f)
    labels, rps, p99, colors = [], [], [], []
    palette = {"kubeserve": "#1f77b4", "ray": "#d62728", "nginx": "#7f7f7f"}
    for system, figures in results["systems"].items():
        for entry in figures["loads"]:
            # The nginx reference row travels with kubeserve's loads (same runs, same replica).
            kind = "nginx" if entry["system"].startswith("nginx") else system
            name = {"kubeserve": "kubeserve", "ray": "Ray Serve 2.60"}.get(kind, entry["system"])
            runs = sorted(entry["runs"], key=lambda r: r["requests_per_s"])
            labels.append(f"{name}\n{entry['setup']}")
            rps.append(entry["requests_per_s"])
            p99.append(runs[len(runs) // 2]["p99_ms"])
            colors.append(palette[kind])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5), sharex=True)
    positions = range(len(labels))
    top.bar(positions, rps, color=colors)
    top.set_yscale("log")
    top.set_ylabel("req/s (median of 3, log scale)")
    top.set_title(f"wrk, 1 thread, 16 connections, 10 s runs - {results['machine']['date']}")
    for x, y in zip(positions, rps, strict=True):
        top.annotate(f"{y:,.0f}", (x, y), ha="center", va="bottom", fontsize=8)
    bottom.bar(positions, p99, color=colors)
    bottom.set_yscale("log")
    bottom.set_ylabel("p99 latency, ms (log scale)")
    for x, y in zip(positions, p99, strict=True):
        bottom.annotate(f"{y:.1f}", (x, y), ha="center", va="bottom", fontsize=8)
    bottom.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
