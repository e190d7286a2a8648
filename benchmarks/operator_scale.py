"""The operator with 1,000 applications: kwok's fake nodes, the real control plane, no kubelet.

The cluster is ``tests/support/kwok_cluster.py`` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler of ``make k8s-node``, and kwok of ``make kwok``) with 50 fake nodes; the build and
replica processes kwok does not run are stood in for by ``tests/support/kwok_pods.py`` (the graph
written by a real ``kubeserve build`` run once, the replica's own HTTP server answering the
operator's health checks and reconfigures on each pod's address). The operator runs as on the
node tier, watching the namespace ``bench``, as the audited user ``kubeserve-operator``: every
request it makes is in the API server's audit log, counted here by verb and resource.

Measured, in this order:

1. **apply -> all Ready**: one ServeInstance, then 1,000 ServeApplications of
   ``ks_composed_app:app`` (3 deployments, 5 replica pods each: 5,000 pods), created through the
   API 16 at a time; the time from the first create to every application's
   ``Ready`` condition True at its generation.
2. **settle**: from all Ready until no client of the API server has written for 10 s (Leases,
   node heartbeats and auth reviews aside): the controller-manager catching up with the
   rollout's pods (``settle_after_ready``: seconds to the last write, every process's cores
   until the 10 s are over).
3. **idle**: then, once 10 s pass without a write (the leader's Lease aside), 60 s counted:
   requests per minute by verb and resource, the operator's CPU and RSS, every process's cores.
4. **one change**: an env var of one application changed (a new build, every deployment rolls)
   while the other 999 sit there; time to Ready at the new generation, polled every 100 ms;
   three runs on three applications, median.
5. **churn**: the same change on 10% of the applications at once; the time until all are Ready
   again, and the requests per minute and CPU of the operator meanwhile.

Run with ``make bench-operator-scale`` (as root, about 15 minutes); writes
``benchmarks/results-operator-scale.json`` and its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import ssl
import statistics
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import report

from support.common import http, wait_for
from support.k8s_operator import KUBESERVE_IMAGE, OperatorProcess, application, install_crds
from support.k8s_operator import instance as serve_instance
from support.kwok_cluster import (
    OPERATOR_SERVICE_ACCOUNT,
    KwokCluster,
    start_kwok_cluster,
    tuning,
)
from support.kwok_pods import PodStandIns

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
IMPORT_PATH = "ks_composed_app:app"
PODS_PER_APP = 5
LOG = ROOT / "var" / "bench-operator-scale.log"
ELECTION = "leases"
CONCURRENT = 16
#: the write verbs of ``apiserver_request_total`` (HTTP methods, lowercased; server-side apply
#: is ``apply``)
HTTP_WRITES = frozenset({"post", "put", "patch", "apply", "delete", "deletecollection"})


class OperatorSampler:
    """CPU seconds and RSS of the operator process, read from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_mib = 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        if "VmRSS:" not in status:
            raise AssertionError(f"the operator exited: see {LOG}")
        kib = next(int(line.split()[1]) for line in status.splitlines() if line[:6] == "VmRSS:")
        self.peak_rss_mib = max(self.peak_rss_mib, kib / 1024)
        return kib / 1024


class ClusterSampler:
    """CPU seconds of every process of the run: the control plane's (etcd, kube-apiserver,
    controller-manager, scheduler, kwok), the operator's and this process's (the pods'
    stand-ins); per phase, as cores used, to say which saturates the machine first."""

    def __init__(self, plane: KwokCluster, operator_pid: int) -> None:
        assert plane.processes is not None
        self.pids = {name: proc.pid for name, proc in plane.processes.processes}
        self.pids["operator"] = operator_pid
        self.pids["stand-ins+bench"] = os.getpid()

    def cpu_s(self) -> dict[str, float]:
        found = {}
        for name, pid in self.pids.items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return found

    def cores(self, before: dict[str, float], seconds: float) -> dict[str, float]:
        """Cores used by each process since ``before`` (1.0: one core busy throughout)."""
        after = self.cpu_s()
        used = {k: round((after[k] - before.get(k, 0.0)) / seconds, 2) for k in after}
        return dict(sorted(used.items(), key=lambda kv: -kv[1]))


def requests_per_app(plane: KwokCluster, since: int, apps: int) -> dict[str, float]:
    """Every request of the operator since ``since`` per application (reads and watches too),
    by verb and resource, the leader's Lease aside."""
    counted = Counter(
        f"{r.verb} {r.resource}" for r in plane.operator_requests(since) if r.resource != ELECTION
    )
    return {"total": round(sum(counted.values()) / apps, 2)} | {
        k: round(v / apps, 2) for k, v in counted.most_common()
    }


def apiserver_metrics(plane: KwokCluster) -> str:
    """The API server's /metrics (Prometheus text)."""
    request = urllib.request.Request(
        f"{plane.server}/metrics", headers={"Authorization": f"Bearer {plane.token}"}
    )
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        return str(response.read().decode())


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            found.append((labels, float(line.rsplit(" ", 1)[1])))
    return found


def priority_levels(plane: KwokCluster) -> dict[str, dict[str, float]]:
    """API Priority and Fairness so far, by priority level: requests dispatched, their mean wait
    in its queues (ms) and the requests it rejected (429): whether the operator's requests
    (``workload-low`` as a ServiceAccount, its Lease in ``leader-election``) queued. (The
    control plane's own clients here are ``system:masters``, exempt.)"""
    text = apiserver_metrics(plane)
    totals: dict[str, dict[str, float]] = {}
    for name, key in (
        ("apiserver_flowcontrol_dispatched_requests_total", "dispatched"),
        ("apiserver_flowcontrol_request_wait_duration_seconds_count", "waited"),
        ("apiserver_flowcontrol_request_wait_duration_seconds_sum", "wait_s"),
        ("apiserver_flowcontrol_rejected_requests_total", "rejected"),
    ):
        for labels, value in _samples(text, name):
            if labels.get("execute") == "false":
                continue  # the rejected ones' wait
            level = totals.setdefault(labels.get("priority_level", "?"), {})
            level[key] = level.get(key, 0.0) + value
    return {
        name: {
            "dispatched": int(level.get("dispatched", 0)),
            "mean_wait_ms": round(
                1000 * level.get("wait_s", 0) / max(level.get("waited", 0), 1), 1
            ),
            "rejected": int(level.get("rejected", 0)),
        }
        for name, level in sorted(totals.items())
    }


def apiserver_requests(plane: KwokCluster) -> Counter[str]:
    """Every client's requests so far (``apiserver_request_total`` of the API server's
    /metrics), by verb and resource (with subresource): the cluster's whole cost, the pods' own
    lifecycle (controllers, scheduler, kwok) included, which the audit log leaves out."""
    counted: Counter[str] = Counter()
    for labels, value in _samples(apiserver_metrics(plane), "apiserver_request_total"):
        resource = labels.get("resource", "") + (
            f"/{labels['subresource']}" if labels.get("subresource") else ""
        )
        counted[f"{labels.get('verb', '').lower()} {resource}"] += int(value)
    return counted


def cluster_requests_per_app(
    plane: KwokCluster, before: Counter[str], apps: int, top: int = 16
) -> dict[str, float]:
    """All clients' requests since ``before`` per application (watches and the Leases aside:
    a watch counts when it starts, a Lease renewal is a node's or the operator's heartbeat)."""
    after = apiserver_requests(plane)
    diff = {
        k: after[k] - before.get(k, 0)
        for k in after
        if not k.startswith("watch") and "leases" not in k
    }
    writes = sum(v for k, v in diff.items() if k.split(" ")[0] in HTTP_WRITES)
    ranked = sorted(((k, v) for k, v in diff.items() if v > 0), key=lambda kv: -kv[1])[:top]
    return {
        "total": round(sum(diff.values()) / apps, 1),
        "writes": round(writes / apps, 1),
    } | {k: round(v / apps, 2) for k, v in ranked}


def operator_metric(operator: OperatorProcess, name: str) -> float | None:
    text = http("GET", f"http://127.0.0.1:{operator.metrics_port}/metrics")[1]
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def ready_apps(plane: KwokCluster, names: set[str] | None = None) -> int:
    """Applications Ready at their generation: a few read one by one, else the whole list (a
    thousand objects with their statuses, megabytes: polled often it would load the API server
    more than the operator does)."""
    path = f"/apis/kubeserve.io/v1beta1/namespaces/{NAMESPACE}/serveapplications"
    if names is not None and len(names) <= 10:
        return sum(_ready(plane.api("GET", f"{path}/{name}")) for name in names)
    items = plane.api("GET", path, timeout_s=120)
    return sum(
        _ready(app) for app in items["items"] if names is None or app["metadata"]["name"] in names
    )


def running_apps(operator: OperatorProcess) -> int:
    """ServeApplications RUNNING as the operator's cache has them (its /metrics): the cheap
    poll while a thousand roll out; :func:`ready_apps` confirms."""
    text = http("GET", f"http://127.0.0.1:{operator.metrics_port}/metrics")[1]
    found = re.search(r'^kubeserve_applications\{status="RUNNING"\} (\S+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _ready(app: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready"
        and c["status"] == "True"
        and c.get("observedGeneration") == app["metadata"]["generation"]
        for c in (app.get("status") or {}).get("conditions", [])
    )


def create_all(plane: KwokCluster, objects: list[dict[str, Any]]) -> None:
    """POST every object, :data:`CONCURRENT` at a time (as a CD tool applying a repository)."""
    path = f"/apis/kubeserve.io/v1beta1/namespaces/{NAMESPACE}/serveapplications"
    with ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(lambda obj: plane.api("POST", path, obj), objects))


def per_minute(plane: KwokCluster, since: int, seconds: float) -> dict[str, Any]:
    requests = plane.operator_requests(since)
    scale = 60.0 / seconds
    by_kind = Counter(f"{r.verb} {r.resource}" for r in requests)
    writes = [r for r in requests if r.is_write]
    return {
        "requests_per_min": round(len(requests) * scale, 1),
        "writes_per_min": round(len(writes) * scale, 1),
        "writes_per_min_besides_election": round(
            sum(r.resource != ELECTION for r in writes) * scale, 1
        ),
        "by_kind_per_min": {k: round(v * scale, 1) for k, v in by_kind.most_common()},
    }


def writes_per_app(plane: KwokCluster, since: int, apps: int) -> dict[str, float]:
    """The operator's writes since ``since`` per application, by verb and resource (the
    leader's Lease aside)."""
    writes = Counter(
        f"{r.verb} {r.resource}"
        for r in plane.operator_requests(since)
        if r.is_write and r.resource != ELECTION
    )
    return {k: round(v / apps, 2) for k, v in writes.most_common()}


def wait_quiet(plane: KwokCluster, quiet_s: float = 10.0, timeout_s: float = 300.0) -> None:
    def quiet() -> bool:
        mark = plane.audit_mark()
        time.sleep(quiet_s)
        return not any(w.is_write and w.resource != ELECTION for w in plane.operator_requests(mark))

    wait_for(quiet, timeout_s, interval_s=0, what=f"{quiet_s:.0f} s without a write")


def change(plane: KwokCluster, name: str, value: str) -> None:
    patch = {"spec": {"runtimeEnv": {"envVars": {"BENCH_CHANGE": value}}}}
    plane.kubectl(
        "patch", "serveapplication", name, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
    )


#: What the chart installs for the operator's ServiceAccount, in ``manifests/`` (the same objects):
#: its namespace, the ServiceAccount, its RBAC, the FlowSchema of its Lease.
OPERATOR_MANIFESTS = ("00-namespace.yaml", "02-serviceaccount.yaml", "03-rbac.yaml",
                      "06-flowschema.yaml")  # fmt: skip


def install_operator_rights(plane: KwokCluster) -> str:
    """Apply the operator's objects of ``manifests/`` (the chart's, rendered with its defaults);
    the namespace the operator runs in (its Lease's, which the FlowSchema names)."""
    for name in OPERATOR_MANIFESTS:
        plane.kubectl("apply", "-f", str(ROOT / "manifests" / name))
    return str(OPERATOR_SERVICE_ACCOUNT.split(":")[2])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "apps": args.apps,
        "nodes": args.nodes,
        "pods": args.apps * PODS_PER_APP,
        "leader_election": args.election,
        "cluster_tuning": sorted(tuning()),
    }
    if args.as_service_account:
        results["operator_identity"] = OPERATOR_SERVICE_ACCOUNT
    with (
        start_kwok_cluster(operator_as_service_account=args.as_service_account) as plane,
        PodStandIns(plane.kubeconfig) as stand_ins,
    ):
        install_crds(plane)
        plane.add_nodes(args.nodes)
        plane.add_namespace(NAMESPACE)
        home = NAMESPACE
        if args.as_service_account:  # the chart's RBAC and FlowSchema, its namespace
            home = install_operator_rights(plane)
        LOG.parent.mkdir(exist_ok=True)
        LOG.write_text("")
        election = [] if args.election else ["--leader-election-lease", ""]
        operator = OperatorProcess(
            plane, home, LOG, kubeconfig=plane.operator_kubeconfig, host="127.0.0.1",
            extra_args=election, also_watch=[NAMESPACE] if home != NAMESPACE else [],
        )  # fmt: skip
        operator.start()
        assert operator.proc is not None
        sampler = OperatorSampler(operator.proc.pid)
        cluster_cpu = ClusterSampler(plane, operator.proc.pid)
        try:
            plane.apply(serve_instance(NAMESPACE, image=KUBESERVE_IMAGE))
            results["rss_mib_before"] = round(sampler.rss_mib(), 1)
            apps = [
                application(NAMESPACE, f"app-{i}", IMPORT_PATH, routePrefix=f"/a{i}")
                for i in range(args.apps)
            ]
            cpu0, t0, rollout = sampler.cpu_s(), time.monotonic(), plane.audit_mark()
            all_cpu0, all_requests0 = cluster_cpu.cpu_s(), apiserver_requests(plane)
            create_all(plane, apps)
            results["apply_s"] = round(time.monotonic() - t0, 1)
            progress = []

            def all_ready() -> bool:
                if operator.proc is not None and operator.proc.poll() is not None:
                    raise AssertionError(f"the operator exited at {progress[-1:]}: see {LOG}")
                ready = running_apps(operator)
                if ready == args.apps:
                    ready = ready_apps(plane)
                sampler.rss_mib()
                progress.append((round(time.monotonic() - t0), ready, stand_ins.replicas))
                print(f"{progress[-1][0]:>5} s: {ready} Ready, {stand_ins.replicas} replicas",
                      flush=True)  # fmt: skip
                return ready == args.apps

            try:
                wait_for(all_ready, args.ready_timeout, interval_s=5, what="all Ready")
            except AssertionError as err:  # the figures so far say what held it up
                results["all_ready_timeout"] = f"{err}"[:300]
            elapsed = time.monotonic() - t0
            results["all_ready_s"] = round(elapsed, 1)
            results["cpu_s_to_ready"] = round(sampler.cpu_s() - cpu0, 1)
            results["cores_to_ready"] = cluster_cpu.cores(all_cpu0, elapsed)
            results["progress"] = progress[:: max(1, len(progress) // 20)]
            results["rss_mib_ready"] = round(sampler.rss_mib(), 1)
            results["rollout_writes_per_app"] = writes_per_app(plane, rollout, args.apps)
            results["rollout_requests_per_app"] = requests_per_app(plane, rollout, args.apps)
            results["rollout_cluster_requests_per_app"] = cluster_requests_per_app(
                plane, all_requests0, args.apps
            )
            results["priority_levels_rollout"] = priority_levels(plane)
            results["lease_during_rollout"] = {
                m: operator_metric(operator, f"kubeserve_operator_{m}")
                for m in ("leader_terms_total", "fence_shut_total")
            }
            if "all_ready_timeout" in results:
                return results

            settle_cpu0, settle_t0 = cluster_cpu.cpu_s(), time.monotonic()
            settled_s = plane.wait_settled(settle_t0)
            results["settle_after_ready"] = {
                "s": settled_s,
                "cores": cluster_cpu.cores(settle_cpu0, time.monotonic() - settle_t0),
            }
            wait_quiet(plane)
            mark, cpu0, t0 = plane.audit_mark(), sampler.cpu_s(), time.monotonic()
            all_cpu0 = cluster_cpu.cpu_s()
            time.sleep(args.window)
            elapsed = time.monotonic() - t0
            results["idle"] = per_minute(plane, mark, elapsed) | {
                "window_s": round(elapsed),
                "cores": cluster_cpu.cores(all_cpu0, elapsed),
                "cpu_percent": round(100 * (sampler.cpu_s() - cpu0) / elapsed, 1),
                "rss_mib": round(sampler.rss_mib(), 1),
            }

            samples = []
            singles = [f"app-{args.apps * k // 10}" for k in (1, 5, 9)][: args.single_runs]
            for i, name in enumerate(singles):
                change(plane, name, f"single-{i}")
                t0 = time.monotonic()
                wait_for(lambda name=name: ready_apps(plane, {name}) == 1, 300, interval_s=0.1,
                         what=f"{name} Ready after its change")  # fmt: skip
                samples.append(round(time.monotonic() - t0, 2))
            results["one_change_s"] = {"median": statistics.median(samples), "samples": samples}

            wait_quiet(plane)
            churned = {f"app-{i}" for i in range(0, args.apps, 10)}
            mark, cpu0, t0 = plane.audit_mark(), sampler.cpu_s(), time.monotonic()
            all_cpu0, all_requests0 = cluster_cpu.cpu_s(), apiserver_requests(plane)
            for name in sorted(churned):
                change(plane, name, "churn")
            wait_for(lambda: ready_apps(plane, churned) == len(churned), args.ready_timeout,
                     interval_s=3, what="the churned applications Ready")  # fmt: skip
            elapsed = time.monotonic() - t0
            results["churn"] = per_minute(plane, mark, elapsed) | {
                "apps": len(churned),
                "writes_per_app": writes_per_app(plane, mark, len(churned)),
                "requests_per_app": requests_per_app(plane, mark, len(churned)),
                "cores": cluster_cpu.cores(all_cpu0, elapsed),
                "cluster_requests_per_app": cluster_requests_per_app(
                    plane, all_requests0, len(churned)
                ),
                "all_ready_s": round(elapsed, 1),
                "cpu_percent": round(100 * (sampler.cpu_s() - cpu0) / elapsed, 1),
            }
            results["rss_mib_peak"] = round(sampler.peak_rss_mib, 1)
            results["priority_levels_at_end"] = priority_levels(plane)
            results["lease_at_end"] = {
                m: operator_metric(operator, f"kubeserve_operator_{m}")
                for m in ("leader_terms_total", "fence_shut_total")
            }
            results["stand_in_errors"] = stand_ins.errors[:20]
        finally:
            operator.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0, help="idle window (s)")
    parser.add_argument("--single-runs", type=int, default=3)
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=report.OPERATOR_SCALE_RESULTS)
    parser.add_argument(
        "--no-election",
        dest="election",
        action="store_false",
        help="run the operator without leader election (--leader-election-lease '')",
    )
    parser.add_argument(
        "--as-service-account",
        action="store_true",
        help="run the operator as the chart's ServiceAccount (manifests/' RBAC and FlowSchema, in "
        "kubeserve-system, watching the bench's namespace) instead of a system:masters user, "
        "whose requests API Priority and Fairness exempts",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = measure(args)
    results["machine"] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    bench_results = ROOT / "benchmarks" / "results.json"
    if (
        args.out == report.OPERATOR_SCALE_RESULTS
        and bench_results.exists()
        and "all_ready_timeout" not in results
    ):
        (ROOT / "benchmarks" / "results.md").write_text(
            report.markdown(json.loads(bench_results.read_text()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
