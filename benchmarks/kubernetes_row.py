"""The no-op app on real pods of the kubernetes tier's node: a proxy pod, its Service, a replica.

    make bench-kubernetes   (as root)

Starts the real single-node cluster of ``tests/support/node_cluster.py`` (containerd, kubelet,
kube-proxy, CoreDNS; pods on the ``10.244.0.0/24`` bridge), applies ``crds/``, starts ``kubeserve
operator``, applies a ServeInstance (HeadOnly proxy, port 8000) and a ServeApplication of
``apps:noop`` (``benchmarks/apps.py``, the app ``make bench`` loads, shipped in the tests' image)
with 1 replica, ``maxOngoingRequests: 100`` and ``numCpus: 0.5``, waits for Ready, then loads,
in turns so all share the same background (``load.measure_together``), with the settings of
``make bench`` but :data:`RUNS` runs of each:

* the proxy pod (``http://<proxy pod IP>:8000/noop``);
* the proxy Service's ClusterIP (the same pod behind kube-proxy's rules);
* the proxy pod of the same app on a second instance, in namespace ``bench-k8s-tcp``, with
  ``spec.proxy.nodeLocalSockets: false`` (the proxy reaches its replica over TCP across the
  bridge; the first instance leaves it unset, and the operator's choice, ``Auto``, gives it the
  node's socket as the namespace admits the pods that use it);
* the reference: ``kubeserve start`` on the host with the same app, its processes in cgroups
  weighted like the pods (:func:`embedded`).

wrk runs in a pod of each namespace, with the proxy pod's CPU requests, for the rows on pods.
Access lines are on everywhere (Ray's default) and each process writes them to a file: the pods
to theirs (``spec.logs.accessLines``' default), ``kubeserve start``'s processes to their logs.

Everything is torn down at the end. The figures go to ``results-kubernetes.json``, and
``results.md`` is rewritten from ``results.json`` plus them (``report.py`` adds the rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bench
import cpu_groups
import load
import report
import systems

from support.common import http, wait_for
from support.k8s_operator import (
    OperatorProcess,
    application,
    install_crds,
    instance,
    ready_pods,
)
from support.node_cluster import (
    CACHE,
    NodeCluster,
    find_node_bin_dir,
    node_missing,
    start_node_cluster,
)
from support.node_cluster import CGROUP as NODE_CGROUP

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

NAMESPACE = "bench-k8s"
#: the same app on an instance with ``spec.proxy.nodeLocalSockets: false`` (TCP to the replica)
TCP_NAMESPACE = "bench-k8s-tcp"
#: the replica pods' CPU request: two of them (one per instance) fit the node's 2 CPUs beside
#: the proxy and wrk pods
REPLICA_CPUS = 0.5
APP = "noop"
ROUTE = "/noop"
PORT = 8000  # the ServeInstance's httpOptions.port, and every replica pod's port
RESULTS = BENCH_DIR / "results-kubernetes.json"
LOG = ROOT / "var" / "bench-kubernetes-operator.log"
#: The load generator's image (``tests/kubernetes/node/build_images.sh``) and its pod.
WRK_ARCHIVE = CACHE / "node" / "images" / "wrk.tar"
WRK_IMAGE = "kubeserve.local/wrk:bookworm"
LOAD_POD = "wrk"
#: runs of each row, in turns: single runs of one row vary by a fifth on this shared machine, and
#: the share asked for is a ratio of two medians
RUNS = 5


def deploy(
    plane: NodeCluster,
    operator: OperatorProcess,
    namespace: str = NAMESPACE,
    node_sockets: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Apply the ServeInstance (``node_sockets``: its ``spec.proxy.nodeLocalSockets``, unset when
    ``None``: the operator's choice) and the
    application in ``namespace`` (which ``operator`` watches), wait for Ready and for the proxy
    Service to answer; the proxy and replica pods by component, and the proxy Service."""
    serving = instance(namespace, PORT)
    if node_sockets is not None:
        serving["spec"]["proxy"] = {"nodeLocalSockets": node_sockets}
    plane.apply(serving)
    plane.apply(
        application(
            namespace, APP, "apps:noop", routePrefix=ROUTE,
            deployments=[{"name": "Noop", "numReplicas": 1, "maxOngoingRequests": 100,
                          "rayActorOptions": {"numCpus": REPLICA_CPUS}}],
        )
    )  # fmt: skip
    for kind, name in (("serveinstance", "default"), ("serveapplication", APP)):
        result = plane.kubectl(
            "wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace,
            "--timeout=180s", check=False, timeout=200,
        )  # fmt: skip
        if result.returncode != 0:
            listing = plane.kubectl("get", "pods,jobs,deploy", "-n", namespace, "-o", "wide").stdout
            status = plane.get(kind, name, namespace).get("status")
            raise RuntimeError(
                f"{kind}/{name} not Ready: {result.stderr}\n{status}\n{listing}\n{operator.log()}"
            )
    found: dict[str, dict[str, Any]] = {}
    for component in ("proxy", "replica"):
        pods = wait_for(
            lambda c=component: ready_pods(plane, namespace, f"app.kubernetes.io/component={c}"),
            60,
            what=f"a ready {component} pod",
        )
        if len(pods) != 1:
            raise RuntimeError(f"expected one {component} pod, found {len(pods)}")
        found[component] = pods[0]
    found["service"] = plane.get("service", "default-proxy", namespace)
    return found


def start_load_pod(plane: NodeCluster, proxy_pod: dict[str, Any]) -> list[str]:
    """The wrk pod beside the proxy pod, with the proxy container's CPU and memory requests (so
    the same cgroup weight); the argv prefix that runs wrk in it."""
    namespace = proxy_pod["metadata"]["namespace"]
    plane.ctr("images", "import", "--no-unpack", str(WRK_ARCHIVE))
    requests = proxy_pod["spec"]["containers"][0].get("resources", {}).get("requests", {})
    plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": LOAD_POD, "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "wrk",
                        "image": WRK_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "infinity"],
                        "resources": {"requests": requests},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    plane.kubectl(
        "wait", "--for=condition=Ready", f"pod/{LOAD_POD}", "-n", namespace, "--timeout=120s",
        timeout=130,
    )  # fmt: skip
    kubectl = [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig)]
    return [*kubectl, "exec", "-n", namespace, LOAD_POD, "-c", "wrk", "--", "wrk"]


def _answers_ok(url: str) -> bool:
    try:
        status, body = http("GET", url, timeout=5)
    except OSError:
        return False
    return bool(status == 200 and body == "ok")


def pod_pids(pod: dict[str, Any]) -> list[int]:
    """The pod's kubeserve processes, the main one first; a proxy pod's ``kubeserve-fastpath``
    (the process in front on the native data path) before it."""
    pids = cpu_groups.processes_of_pod(pod["metadata"]["uid"])
    if not pids:
        raise RuntimeError(f"no process of pod {pod['metadata']['name']} found in /proc")
    front = [pid for pid in pids if comm(pid) == FASTPATH_COMM]
    return [*front, *(pid for pid in pids if pid not in front)]


#: ``/proc/PID/comm`` of the native process: the kernel keeps the first 15 characters of its name.
FASTPATH_COMM = "kubeserve-fastpath"[:15]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


#: What the proxy's speed depends on besides its code: the interpreter and its event loop.
_INTERPRETER = (
    "import sys, sysconfig, importlib.metadata as m; "
    "print(sys.version.split()[0], sysconfig.get_config_var('OPT'), "
    "*(f'{p} {m.version(p)}' for p in ('uvloop', 'httptools')), sep='; ')"
)


def _interpreter(plane: NodeCluster, pod: dict[str, Any]) -> str:
    """The proxy image's Python, its compiler flags, and uvloop's and httptools' versions."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    argv = ["exec", "-n", namespace, name, "--", "python3", "-c", _INTERPRETER]
    return plane.kubectl(*argv, check=False).stdout.strip() or "?"


def _interpreter_here() -> str:
    """The same of this virtualenv, which ``kubeserve start`` runs from."""
    argv = [sys.executable, "-c", _INTERPRETER]
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def pod_group(pid: int) -> Path:
    """The pod's cgroup (the container's parent), whose shares weigh it against other pods."""
    return cpu_groups.group_of(pid).parent


@contextlib.contextmanager
def embedded(weights: dict[str, int], parent_shares: int) -> Iterator[tuple[str, list[int], Path]]:
    """``kubeserve start`` with the no-op app, its proxy and replica each in a cgroup of the
    bench weighted like their pods, and one for wrk weighted like the wrk pod; (url, pids with
    the proxy first, the load's cgroup)."""
    system = systems.Kubeserve()
    system.start()
    try:
        system.put([bench.noop_app("benchmarks.apps:noop", 1)])
        system.wait_replicas("noop", "Noop", 1, 180)
        # the proxy's processes, the one in front first (its kubeserve-fastpath child on the
        # native data path), all in the proxy's cgroup as they share the proxy pod's
        proxy = bench.proxy_front(system.process_pids()["proxy"])
        replicas = bench.replica_pids(system, "noop")
        with cpu_groups.bench_groups(parent_shares, weights) as parent:
            cpu_groups.join(parent / "proxy", list(proxy))
            cpu_groups.join(parent / "replica", replicas)
            url = f"http://127.0.0.1:{system.proxy_port}/noop"
            wait_for(lambda: _answers_ok(url), 60, what=f"ok from {url}")
            yield url, [*proxy, *replicas], parent / "load"
    finally:
        system.stop()


def groups(pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {role: asdict(cpu_groups.read(pod_group(pid))) for role, pid in pids.items()}


@dataclass
class PodsToLoad:
    """The no-op app's ``proxy`` and ``replica`` pods, the ``load`` pod and the proxy
    ``service``; the pods' processes and how to run wrk in the load pod."""

    pods: dict[str, dict[str, Any]]
    #: the argv prefix that runs wrk in the load pod (its arguments appended)
    in_pod: list[str]
    #: the proxy pod's and the replica pod's processes, the proxy's front first
    serving: list[int]
    #: their runtime shims (which carry the logs the pods write)
    shims: list[int]

    def main_pids(self) -> dict[str, int]:
        """The first process of each pod, by role: its pod's cgroup is the pod's."""
        return {role: pod_pids(self.pods[role])[0] for role in ("proxy", "replica", "load")}

    def setups(self) -> list[tuple[str, str, str, list[int]]]:
        """The rows on pods for ``load.measure_together`` (run each with :attr:`in_pod`): the
        proxy pod's address and the proxy Service's ClusterIP, with the processes measured."""
        proxy_ip = self.pods["proxy"]["status"]["podIP"]
        cluster_ip = self.pods["service"]["spec"]["clusterIP"]
        measured = [*self.serving, *self.shims]
        return [
            (report.K8S_PROXY, report.KUBERNETES_SYSTEM, f"http://{proxy_ip}:{PORT}{ROUTE}",
             measured),
            (report.K8S_SERVICE, report.KUBERNETES_SYSTEM, f"http://{cluster_ip}:{PORT}{ROUTE}",
             measured),
        ]  # fmt: skip


def prepare_pods(
    plane: NodeCluster,
    operator: OperatorProcess,
    namespace: str = NAMESPACE,
    node_sockets: bool | None = None,
) -> PodsToLoad:
    """:func:`deploy` in ``namespace``, then the load pod beside the proxy pod; the pods'
    processes found in /proc."""
    pods = deploy(plane, operator, namespace, node_sockets)
    in_pod = start_load_pod(plane, pods["proxy"])
    pods["load"] = plane.get("pod", LOAD_POD, namespace)
    proxy_ip = pods["proxy"]["status"]["podIP"]
    cluster_ip = pods["service"]["spec"]["clusterIP"]
    print(f"proxy pod {proxy_ip}, proxy Service {cluster_ip}", flush=True)
    serving = [*pod_pids(pods["proxy"]), *pod_pids(pods["replica"])]
    # (the native process's parent is the pod's Python proxy, not a shim)
    shims = sorted({_parent(pid) for pid in serving} - set(serving))
    where = [cpu_groups.read(cpu_groups.group_of(pid)).path for pid in shims]
    print(f"pod processes {serving}, their shims {shims} (cgroups {where})", flush=True)
    return PodsToLoad(pods, in_pod, serving, shims)


def run() -> dict[str, Any]:
    bin_dir = find_node_bin_dir()
    missing = node_missing(bin_dir) or cpu_groups.available()
    if missing is None and not WRK_ARCHIVE.exists():
        missing = f"no {WRK_ARCHIVE}: run `make node-images`"
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
        plane.add_namespace(TCP_NAMESPACE)
        operator = OperatorProcess(plane, NAMESPACE, LOG, also_watch=[TCP_NAMESPACE])
        try:
            operator.start()
            on_pods = prepare_pods(plane, operator)
            # the same with spec.proxy.nodeLocalSockets: false: the proxy reaches its replica
            # over TCP across the bridge instead of through the node's directory of sockets
            over_tcp = prepare_pods(plane, operator, TCP_NAMESPACE, node_sockets=False)
            tcp_url = over_tcp.setups()[0][2]
            pods, main_pids = on_pods.pods, on_pods.main_pids()
            weights = {role: g["shares"] for role, g in groups(main_pids).items()}
            node_shares = cpu_groups.read(cpu_groups.CPU_ROOT / NODE_CGROUP).shares
            print(f"pod cpu.shares {weights}, /{NODE_CGROUP} {node_shares}", flush=True)
            before = groups(main_pids)
            on_pods_roles = _roles(on_pods.serving, on_pods.shims)
            with embedded(weights, node_shares) as (local_url, local_pids, load_group):
                roles = {
                    report.K8S_EMBEDDED: _roles(local_pids, []),
                    report.K8S_PROXY: on_pods_roles,
                    report.K8S_SERVICE: on_pods_roles,
                    report.K8S_TCP: _roles(over_tcp.serving, over_tcp.shims),
                }
                measured = [*over_tcp.serving, *over_tcp.shims]
                loads = load.measure_together(
                    [
                        (report.K8S_EMBEDDED, report.KUBERNETES_SYSTEM, local_url, local_pids),
                        *on_pods.setups(),
                        (report.K8S_TCP, report.KUBERNETES_SYSTEM, tcp_url, measured),
                    ],
                    commands=[cpu_groups.command_in(load_group, load.host_wrk()),
                              on_pods.in_pod, on_pods.in_pod, over_tcp.in_pod],
                    runs=RUNS,
                )  # fmt: skip
            after = groups(main_pids)
            image = _interpreter(plane, pods["proxy"])
            version = plane.kubectl("version", "-o", "json", check=False).stdout
        finally:
            operator.stop()
    machine["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    server = json.loads(version or "{}").get("serverVersion", {}).get("gitVersion", "?")
    return {
        "machine": machine,
        "kube_apiserver": server,
        "pods": pod_conditions(pods, before, after),
        "interpreters": {"proxy pod": image, "host": _interpreter_here()},
        "loads": [load.as_json(r) | {"processes": roles[r.setup]} for r in loads],
    }


def _roles(serving: list[int], shims: list[int]) -> list[str]:
    """What each measured process is, in the order measured: the native front, the Python
    proxy, the replica, then the pods' runtime shims."""
    names = ["front (kubeserve-fastpath)" if comm(pid) == FASTPATH_COMM else "" for pid in serving]
    rest = iter(["Python proxy", "replica"] if names[0] else ["proxy", "replica"])
    return [name or next(rest, "replica") for name in names] + ["runtime shim"] * len(shims)


def pod_conditions(
    pods: dict[str, dict[str, Any]],
    before: dict[str, dict[str, Any]],
    after: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Per pod: its containers' resources, its cgroup's weight and quota, and the CFS periods
    it was throttled in during the loads."""
    return {
        role: {
            "resources": pods[role]["spec"]["containers"][0].get("resources", {}),
            "cgroup": after[role]["path"],
            "cpu_shares": after[role]["shares"],
            "cfs_quota_us": after[role]["quota_us"],
            "throttled_periods": after[role]["nr_throttled"] - before[role]["nr_throttled"],
            "throttled_ms": round(after[role]["throttled_ms"] - before[role]["throttled_ms"], 1),
        }
        for role in before
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
