"""The data path on pods as ``make bench-kubernetes`` measures it, briefly, on the real node: the
functions of ``benchmarks/kubernetes_row.py`` deploy the no-op app, start wrk in a pod of its own
with the proxy pod's CPU requests, and load the proxy pod and the proxy Service from there.

What must hold is how the figures are made, not how fast anything is (speed is the bench's): wrk
runs in the load pod's own cgroup, beside the proxy pod's and weighted like it; every request is
answered (no non-2xx answer, no socket error in wrk's output); the figures the bench reports (req/s,
latencies, CPU per request of the pods' processes, each pod's cgroup weight and throttling) are
produced."""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from support.common import ROOT
from support.k8s_operator import OperatorProcess
from support.node_cluster import CACHE, NodeCluster

#: a few seconds of load per row (the bench runs 3 x 10 s after 2 s of warm-up)
SECONDS = 3


@pytest.fixture
def row(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/kubernetes_row.py``, imported as the bench runs it (its directory on the
    path, for the modules it imports: ``load``, ``cpu_groups``...)."""
    if not (CACHE / "node" / "images" / "wrk.tar").exists():
        pytest.skip("no wrk image: run `make node-images`")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("kubernetes_row")
    reason = module.cpu_groups.available()
    if reason is not None:
        pytest.skip(reason)
    return module


@contextlib.contextmanager
def wrk_cgroups(row: ModuleType, uid: str) -> Iterator[set[Path]]:
    """The pod cgroups of the ``wrk`` processes of pod ``uid`` seen in /proc meanwhile (every
    0.2 s)."""
    seen: set[Path] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for pid in row.cpu_groups.processes_of_pod(uid):
                if row.comm(pid) == "wrk":
                    with contextlib.suppress(OSError, RuntimeError):  # it ended meanwhile
                        seen.add(row.pod_group(pid))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def test_the_bench_loads_the_proxy_pod_from_a_pod_of_the_same_cpu_weight_without_errors(
    node: NodeCluster,
    node_namespace: str,
    node_operator: OperatorProcess,
    row: ModuleType,
) -> None:
    pods = row.prepare_pods(node, node_operator, node_namespace)
    # the instance leaves spec.proxy.nodeLocalSockets unset: the operator's Auto gave its pods
    # the node's socket directory, the namespace (the default level) admitting them
    status = node.get("serveinstance", "default", node_namespace)["status"]
    assert status["nodeLocalSockets"]["enabled"] is True, status["nodeLocalSockets"]
    for component in ("proxy", "replica"):
        volumes = pods.pods[component]["spec"]["volumes"]
        assert [v["name"] for v in volumes if "hostPath" in v] == ["node-sockets"], component
    main_pids = pods.main_pids()
    load_pod, proxy_pod = pods.pods["load"], pods.pods["proxy"]
    # the load pod asks for what the proxy container asks for
    requests = proxy_pod["spec"]["containers"][0]["resources"]["requests"]
    assert requests.get("cpu"), requests
    assert load_pod["spec"]["containers"][0]["resources"]["requests"] == requests
    before = row.groups(main_pids)
    uid = load_pod["metadata"]["uid"]
    with wrk_cgroups(row, uid) as seen:
        loads = row.load.measure_together(
            pods.setups(),
            runs=1,
            commands=[pods.in_pod, pods.in_pod],
            seconds=SECONDS,
            warmup_s=1,
        )
    after = row.groups(main_pids)
    conditions = row.pod_conditions(pods.pods, before, after)
    # wrk ran in the load pod's own cgroup, not the proxy's, not the host's, weighted like the
    # proxy pod
    load_group = row.pod_group(main_pids["load"])
    assert seen == {load_group}
    assert f"pod{uid}" in load_group.name or f"pod{uid.replace('-', '_')}" in load_group.name
    assert load_group != row.pod_group(main_pids["proxy"])
    assert conditions["load"]["cpu_shares"] == conditions["proxy"]["cpu_shares"], conditions
    # every request answered: wrk counted no non-2xx answer and no socket error
    figures = [row.load.as_json(result) for result in loads]
    for figure in figures:
        print(
            f"{figure['setup']}: {figure['requests_per_s']:.0f} req/s, "
            f"CPU {figure['cpu_all_us']:.1f} us/req all, errors {figure['runs'][0]['errors']}"
        )
    assert [f["setup"] for f in figures] == [s[0] for s in pods.setups()]
    assert [run["errors"] for f in figures for run in f["runs"]] == [0, 0], figures
    # the figures the bench reports were produced
    for figure in figures:
        assert figure["requests_per_s"] > 0, figure
        (only,) = figure["runs"]
        assert all(math.isfinite(only[key]) for key in ("p50_ms", "p99_ms")), only
        assert len(figure["cpu_each_us"]) == len(pods.serving) + len(pods.shims), figure
        assert figure["cpu_us"] > 0 and figure["cpu_all_us"] >= figure["cpu_us"], figure
    assert set(conditions) == {"proxy", "replica", "load"}
    for condition in conditions.values():
        assert condition["cpu_shares"] > 0 and condition["throttled_periods"] >= 0, conditions
