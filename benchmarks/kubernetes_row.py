"""The no-op app through the kubeserve proxy on the Kubernetes test cluster.

    make bench-kubernetes
    (or: KUBESERVE_K8S_BIN=~/.cache/kubeserve/k8s/v1.36.3/bin \\
         .venv/bin/python benchmarks/kubernetes_row.py)

Starts the test control plane of ``tests/support/k8s_control_plane.py`` (pods are local
processes on 127.0.0.x), applies ``crds/``, starts ``kubeserve operator``, applies a
ServeInstance (HeadOnly proxy, port 8000) and a ServeApplication of ``apps:noop``
(``benchmarks/apps.py``, the app ``make bench`` loads) with 1 replica
and ``maxOngoingRequests: 100``, waits for Ready, then loads the proxy pod
(``http://<proxy pod IP>:8000/noop``) with the settings of ``make bench`` (``load.py``). The
reference row is the same replica code without the data-plane handshake
(``plain_replica.py``; a replica pod only takes authenticated connections, which wrk cannot make),
run beside the cluster so both rows share its background load.
Everything is torn down at the end. The figures go to ``results-kubernetes.json``, and
``results.md`` is rewritten from ``results.json`` plus them (``report.py`` adds the rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bench
import load
import plain_replica
import report

from support.common import free_port, http, wait_for
from support.k8s_control_plane import ControlPlane, find_bin_dir, start_control_plane
from support.k8s_operator import (
    OperatorProcess,
    application,
    install_crds,
    instance,
    ready_pods,
)

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

NAMESPACE = "bench-k8s"
APP = "noop"
ROUTE = "/noop"
PORT = 8000  # the ServeInstance's httpOptions.port, and every replica pod's port
RESULTS = BENCH_DIR / "results-kubernetes.json"
LOG = ROOT / "var" / "bench-kubernetes-operator.log"


def deploy(plane: ControlPlane, operator: OperatorProcess) -> tuple[str, str]:
    """Apply the ServeInstance and the application, wait for Ready; (proxy IP, replica IP)."""
    plane.apply(instance(NAMESPACE, PORT))
    plane.apply(
        application(
            NAMESPACE, APP, "apps:noop", routePrefix=ROUTE,
            deployments=[{"name": "Noop", "numReplicas": 1, "maxOngoingRequests": 100}],
        )
    )  # fmt: skip
    for kind, name in (("serveinstance", "default"), ("serveapplication", APP)):
        result = plane.kubectl(
            "wait", "--for=condition=Ready", f"{kind}/{name}", "-n", NAMESPACE,
            "--timeout=180s", check=False, timeout=200,
        )  # fmt: skip
        if result.returncode != 0:
            pods = plane.kubectl("get", "pods,jobs,deploy", "-n", NAMESPACE, "-o", "wide").stdout
            status = plane.get(kind, name, NAMESPACE).get("status")
            raise RuntimeError(
                f"{kind}/{name} not Ready: {result.stderr}\n{status}\n{pods}\n{operator.log()}"
            )
    ips = {}
    for component in ("proxy", "replica"):
        pods = wait_for(
            lambda c=component: ready_pods(plane, NAMESPACE, f"app.kubernetes.io/component={c}"),
            60,
            what=f"a ready {component} pod",
        )
        if len(pods) != 1:
            raise RuntimeError(f"expected one {component} pod, found {len(pods)}")
        ips[component] = pods[0]["status"]["podIP"]
    url = f"http://{ips['proxy']}:{PORT}{ROUTE}"
    wait_for(lambda: _answers_ok(url), 60, what=f"ok from {url}")
    return ips["proxy"], ips["replica"]


def _answers_ok(url: str) -> bool:
    try:
        status, body = http("GET", url, timeout=5)
    except OSError:
        return False
    return bool(status == 200 and body == "ok")


def run() -> dict[str, Any]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("no control-plane binaries: run `make k8s-binaries`")
    machine = bench.machine()
    print(f"load average before: {' '.join(machine['load_before'])}", flush=True)
    with start_control_plane(bin_dir) as plane:
        LOG.parent.mkdir(exist_ok=True)
        LOG.unlink(missing_ok=True)
        install_crds(plane)
        plane.add_namespace(NAMESPACE)
        operator = OperatorProcess(plane, NAMESPACE, LOG)
        try:
            operator.start()
            proxy_ip, replica_ip = deploy(plane, operator)
            print(f"proxy pod {proxy_ip}, replica pod {replica_ip}", flush=True)
            with plain_replica.running("benchmarks.apps:noop", "Noop", free_port()) as direct:
                reference = load.measure(
                    "no-op, direct to replica pod", report.KUBERNETES_SYSTEM, direct
                )
            loads = [
                reference,
                load.measure(
                    "no-op via proxy pod, 1 replica",
                    report.KUBERNETES_SYSTEM,
                    f"http://{proxy_ip}:{PORT}{ROUTE}",
                ),
            ]
            version = plane.kubectl("version", "-o", "json", check=False).stdout
        finally:
            operator.stop()
    machine["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    server = json.loads(version or "{}").get("serverVersion", {}).get("gitVersion", "?")
    return {
        "machine": machine,
        "kube_apiserver": server,
        "loads": [asdict(r) | {"requests_per_s": r.requests_per_s} for r in loads],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    args = parser.parse_args()
    figures = run()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / RESULTS.name).write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out / RESULTS.name}")
    main_results = args.out / "results.json"
    if main_results.exists():
        results = json.loads(main_results.read_text())
        results["kubernetes"] = figures
        (args.out / "results.md").write_text(report.markdown(results))
        print(f"wrote {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
