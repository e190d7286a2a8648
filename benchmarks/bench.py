"""``make bench``: kubeserve and Ray Serve 2.60 side by side, one system at a time, on 127.0.0.1.

    .venv/bin/python benchmarks/bench.py --ray-venv ~/.cache/kubeserve/ray-2.60.0 \\
        [--plot-python ~/.cache/kubeserve/bench/bin/python] [--only kubeserve|ray]

For each system: deploy the no-op app (1 replica), load it directly (kubeserve only: the same
replica code without the data-plane handshake, see plain_replica.py, in turns with the proxy and
with nginx in front of that replica, see nginx.py) and through the proxy, scale it to 2 replicas
and load again; deploy the composed example and load it; time the control plane (deploy,
user_config, scale 1 -> 4, and Ray's quickstart driver script from its start to its first answer;
five runs); read the RSS of the proxy, the replicas and the controller after the load. Then write
``results.json``, ``results.md`` and (with ``--plot-python``) ``results.png`` next to this file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import control_plane
import load
import nginx
import plain_replica
import report
from systems import BENCH_DIR, Kubeserve, RayServe, ServeSystem, free_port, rss_mb

CONTROL_PLANE_RUNS = 5


def noop_app(import_path: str, replicas: int) -> dict[str, Any]:
    return {
        "name": "noop",
        "route_prefix": "/noop",
        "import_path": import_path,
        "deployments": [{"name": "Noop", "num_replicas": replicas}],
    }


def bench_system(system: ServeSystem, noop_path: str, composed_path: str) -> dict[str, Any]:
    print(f"== {system.name}", flush=True)
    system.start()
    try:
        return _bench_started(system, noop_path, composed_path)
    finally:
        system.stop()


def replica_pids(system: ServeSystem, app: str) -> list[int]:
    found = system.applications().get(app) or {"deployments": {}}
    return [
        int(r["pid"])
        for d in found["deployments"].values()
        for r in d["replicas"]
        if r.get("state") == "RUNNING" and r.get("pid")
    ]


def proxy_front(proxy_pid: int) -> tuple[int, ...]:
    """The proxy's processes, the one in front of clients first: its ``kubeserve-fastpath``
    child on the native data path, then the proxy (alone on the Python path, or for Ray)."""
    return (*load.children(proxy_pid), proxy_pid)


def _bench_started(system: ServeSystem, noop_path: str, composed_path: str) -> dict[str, Any]:
    loads: list[load.LoadResult] = []
    proxy = f"http://127.0.0.1:{system.proxy_port}"
    one = [noop_app(noop_path, 1)]
    system.put(one)
    system.wait_replicas("noop", "Noop", 1, 180)
    # CPU per request is read for the process in front (on kubeserve's default, native data path
    # the proxy's kubeserve-fastpath child, else the proxy; an nginx worker; or the replica loaded
    # directly) and for all the serving processes of the row (the Python proxy included).
    front = proxy_front(system.process_pids()["proxy"])
    through_proxy = (*front, *replica_pids(system, "noop"))
    if isinstance(system, Kubeserve):
        # The proxy's cost is judged against the replica alone (and against nginx in front of
        # the same replica code), so these three are measured in turns (load.measure_together).
        # Replicas take authenticated connections only: the direct and nginx rows load the same
        # replica code without the handshake (plain_replica.py; per request it costs the same).
        with (
            plain_replica.running(noop_path, "Noop", free_port()) as direct,
            nginx.reference_proxy(urlsplit(direct.url).port or 0) as reference,
        ):
            together: list[tuple[str, str, str, tuple[int, ...]]] = [
                ("no-op, direct to replica", system.name, direct.url, (direct.pid,)),
                ("no-op via proxy, 1 replica", system.name, f"{proxy}/noop", through_proxy),
            ]
            if reference is None:
                print("  (no nginx: the reference row is left out)", flush=True)
            else:
                workers = tuple(load.children(nginx.master_pid(reference)))
                together.append(
                    (
                        report.NGINX_SETUP,
                        report.NGINX_SYSTEM,
                        f"{reference}noop",
                        (*workers, direct.pid),
                    )
                )
            loads += load.measure_together(together)
    else:
        loads.append(
            load.measure(
                "no-op via proxy, 1 replica", system.name, f"{proxy}/noop", pids=through_proxy
            )
        )

    two = [noop_app(noop_path, 2)]
    system.put(two)
    system.wait_replicas("noop", "Noop", 2, 180)
    loads.append(
        load.measure(
            "no-op via proxy, 2 replicas",
            system.name,
            f"{proxy}/noop",
            pids=(*front, *replica_pids(system, "noop")),
        )
    )
    noop_replica = system.running_replicas("noop", "Noop")[0]["pid"]

    cp = control_plane.ControlPlane()
    rss: dict[str, float] = {}
    for run in range(CONTROL_PLANE_RUNS):
        running, answered = control_plane.deploy(system, two, composed_path)
        cp.deploy_s.append(running)
        cp.first_answer_s.append(answered)
        if run == 0:
            loads.append(
                load.measure(
                    "composed (ingress -> handle)",
                    system.name,
                    f"{proxy}/composed?name=x",
                    pids=(*front, *replica_pids(system, "composed")),
                )
            )
            ingress = system.running_replicas("composed", "Frontend")[0]["pid"]
            pids = system.process_pids()
            # the proxy's resident memory: of all its processes (its kubeserve-fastpath child
            # on the native data path included), that child's also shown on its own
            native = load.children(pids["proxy"])
            rss = {
                "proxy": sum(rss_mb(pid) for pid in (pids["proxy"], *native)),
                **({"proxy's kubeserve-fastpath": sum(map(rss_mb, native))} if native else {}),
                "replica (no-op)": rss_mb(noop_replica),
                "replica (composed ingress)": rss_mb(ingress),
                "controller": rss_mb(pids["controller"]),
            }
        greeting = f"Greeting{run}"
        cp.user_config_s.append(
            control_plane.change_user_config(system, two, composed_path, greeting)
        )
        cp.scale_s.append(control_plane.scale(system, two, composed_path, greeting, 4))
        control_plane.remove(system, two)
        cp.driver_s.append(control_plane.driver_first_answer(system))
        print(
            f"  control plane run {run}: deploy {running:.3f} s, first answer {answered:.3f} s, "
            f"user_config {cp.user_config_s[-1]:.3f} s, scale 1->4 {cp.scale_s[-1]:.3f} s, "
            f"quickstart driver -> first answer {cp.driver_s[-1]:.3f} s",
            flush=True,
        )
    return {
        "loads": [load.as_json(r) for r in loads],
        "control_plane": asdict(cp) | {"medians": cp.medians()},
        "rss_mb": rss,
    }


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0],
        "load_before": Path("/proc/loadavg").read_text().split()[:3],
        "nginx": nginx.version(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray-venv", type=Path, required=True)
    parser.add_argument("--plot-python", type=Path, default=None)
    parser.add_argument("--only", choices=["kubeserve", "ray"], default=None)
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    parser.add_argument(
        "--write-baseline",
        action="store_true",
        help=f"make this run's kubeserve rows the baseline ({report.BASELINE.name})",
    )
    args = parser.parse_args()

    results: dict[str, Any] = {"machine": machine(), "systems": {}}
    print(f"load average before: {' '.join(results['machine']['load_before'])}", flush=True)
    if args.only in (None, "kubeserve"):
        results["systems"]["kubeserve"] = bench_system(
            Kubeserve(), "benchmarks.apps:noop", "examples.composed:app"
        )
    if args.only in (None, "ray"):
        results["systems"]["ray"] = bench_system(
            RayServe(args.ray_venv), "ray_apps:noop", "ray_apps:composed"
        )
    results["machine"]["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    if report.BASELINE.exists():
        results["baseline"] = json.loads(report.BASELINE.read_text())
    if args.write_baseline and "kubeserve" in results["systems"]:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        results["baseline"] = {
            "date": results["machine"]["date"],
            "commit": commit,
            "load": " ".join(results["machine"]["load_before"]),
            "rows": report.baseline_rows(results),
        }
        report.BASELINE.write_text(json.dumps(results["baseline"], indent=1) + "\n")
        print(f"wrote {report.BASELINE}")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(report.markdown(results))
    print(f"wrote {args.out / 'results.md'}")
    if args.plot_python is not None:
        subprocess.run(
            [str(args.plot_python), str(BENCH_DIR / "plot.py"), str(args.out / "results.json"),
             str(args.out / "results.png")],
            check=True,
        )  # fmt: skip
        print(f"wrote {args.out / 'results.png'}")
    for name, figures in results["systems"].items():
        medians = figures["control_plane"]["medians"]
        print(name, {k: round(v, 3) for k, v in medians.items()}, figures["rss_mb"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
