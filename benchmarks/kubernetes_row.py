"""The no-op app on real pods of the kubernetes tier's node: a proxy pod, its Service, a replica.

    make bench-kubernetes   (as root)

Starts the real single-node cluster of ``tests/support/node_cluster.py`` (containerd, kubelet,
kube-proxy, CoreDNS; pods on the ``10.244.0.0/24`` bridge), applies ``crds/``, starts ``kubeserve
operator``, applies a ServeInstance (HeadOnly proxy, port 8000) and a ServeApplication of
``apps:noop`` (``benchmarks/apps.py``, the app ``make bench`` loads, shipped in the tests' image)
with 1 replica and ``maxOngoingRequests: 100``, waits for Ready, then loads, in turns so all share
the same background (``load.measure_together``), with the settings of ``make bench``:

* the proxy pod (``http://<proxy pod IP>:8000/noop``);
* the proxy Service's ClusterIP (the same pod behind kube-proxy's rules);
* the reference: the same replica code without the data-plane handshake on the host
  (``plain_replica.py``; a replica pod only takes authenticated connections, which wrk cannot
  make).

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
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    OperatorProcess,
    application,
    install_crds,
    instance,
    ready_pods,
)
from support.node_cluster import find_node_bin_dir, node_missing, start_node_cluster

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

NAMESPACE = "bench-k8s"
APP = "noop"
ROUTE = "/noop"
PORT = 8000  # the ServeInstance's httpOptions.port, and every replica pod's port
RESULTS = BENCH_DIR / "results-kubernetes.json"
LOG = ROOT / "var" / "bench-kubernetes-operator.log"


def deploy(plane: ControlPlane, operator: OperatorProcess) -> tuple[str, str]:
    """Apply the ServeInstance and the application, wait for Ready; (proxy pod IP, proxy
    Service ClusterIP)."""
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
    cluster_ip = plane.get("service", "default-proxy", NAMESPACE)["spec"]["clusterIP"]
    service = f"http://{cluster_ip}:{PORT}{ROUTE}"
    wait_for(lambda: _answers_ok(service), 60, what=f"ok from {service}")
    return ips["proxy"], cluster_ip


def _answers_ok(url: str) -> bool:
    try:
        status, body = http("GET", url, timeout=5)
    except OSError:
        return False
    return bool(status == 200 and body == "ok")


def run() -> dict[str, Any]:
    bin_dir = find_node_bin_dir()
    missing = node_missing(bin_dir)
    if missing is not None:
        raise SystemExit(missing)
    assert bin_dir is not None
    machine = bench.machine()
    print(f"load average before: {' '.join(machine['load_before'])}", flush=True)
    with start_node_cluster(bin_dir) as plane:
        LOG.parent.mkdir(exist_ok=True)
        LOG.unlink(missing_ok=True)
        install_crds(plane)
        plane.add_namespace(NAMESPACE)
        operator = OperatorProcess(plane, NAMESPACE, LOG)
        try:
            operator.start()
            proxy_ip, cluster_ip = deploy(plane, operator)
            print(f"proxy pod {proxy_ip}, proxy Service {cluster_ip}", flush=True)
            with plain_replica.running("benchmarks.apps:noop", "Noop", free_port()) as direct:
                loads = load.measure_together(
                    [
                        (
                            "no-op, direct to replica code",
                            report.KUBERNETES_SYSTEM,
                            direct.url,
                            (direct.pid,),
                        ),
                        (
                            "no-op via proxy pod, 1 replica",
                            report.KUBERNETES_SYSTEM,
                            f"http://{proxy_ip}:{PORT}{ROUTE}",
                        ),
                        (
                            "no-op via proxy Service ClusterIP",
                            report.KUBERNETES_SYSTEM,
                            f"http://{cluster_ip}:{PORT}{ROUTE}",
                        ),
                    ]
                )
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
