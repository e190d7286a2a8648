"""Fifty applications on kwok's fake nodes: all Ready, and an operator that writes nothing once
nothing changes, and whose periodic resync skips the passes over applications none of whose
inputs changed; a change of one application then writes its status a few times, not at every
pod event of its roll; a write of the instance's status wakes none of the applications
(``make bench-operator`` runs the same with 1,000)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest

from kubeserve.runtime.kubernetes.contract import APPLICATION_LABEL
from support.common import http, wait_for
from support.k8s_operator import (
    KUBESERVE_IMAGE,
    OperatorProcess,
    application,
    instance,
    ready_at_generation,
)
from support.kwok_cluster import KwokCluster

APPS = 50
#: The operator's own leader-election Lease: renewed every retry period (2 s) by design, so that a
#: killed leader is replaced within seconds; every other write is a change it made.
ELECTION = "leases"
#: longer than the operator's resync interval (30 s), so a pass over every object falls inside
IDLE_WINDOW_S = 40.0
#: The status writes of one application's change that rolls its 5 replica pods (every one
#: replaced: each created, scheduled, ready, reconfigured, the old one stopping): the statuses a
#: reader acts on (Ready False, each deployment UPDATING then HEALTHY, Ready True) and progress
#: in between at most every 10 s (so a change slowed by a loaded machine may write one more per
#: 10 s it takes); written at every pod event, it was about twenty.
STATUS_WRITES_PER_CHANGE = 12
PROGRESS_INTERVAL_S = 10.0
#: The objects kubeserve makes per application of ``ks_composed_app`` (Model of 3 replicas,
#: tokenizer and Ingress of 1): a workload and a headless Service (whose EndpointSlices the
#: proxies read) per deployment, and a PodDisruptionBudget for Model alone (a budget over one
#: replica never refuses an eviction). The build Job and the graph ConfigMap it writes are one
#: for all fifty (the same image, module and environment): :data:`BUILDS`.
OBJECTS_PER_APP = {"Deployment": 3, "PodDisruptionBudget": 1, "Service": 3}
BUILDS = "app.kubernetes.io/component=build"
#: What a namespace of applications holds, counted per application
KINDS = (
    "deployments,replicasets,pods,services,endpoints,endpointslices,poddisruptionbudgets,jobs,"
    "configmaps,events"
)


def metric(operator: OperatorProcess, name: str) -> float:
    text = http("GET", f"http://127.0.0.1:{operator.metrics_port}/metrics")[1]
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def ready_count(plane: KwokCluster, namespace: str) -> int:
    items = plane.get("serveapplications", namespace=namespace)["items"]
    return sum(ready_at_generation(app) for app in items)


def objects_per_app(plane: KwokCluster, namespace: str, selector: str = "") -> dict[str, float]:
    """The objects of ``namespace`` (those of ``selector``) per application, by kind."""
    items = plane.get(KINDS, namespace=namespace, selector=selector or None)["items"]
    counts = Counter(str(item["kind"]) for item in items)
    return {kind: round(count / APPS, 2) for kind, count in sorted(counts.items())}


@pytest.mark.timeout(600)
def test_fifty_applications_ready_then_no_writes(
    kwok: KwokCluster, kwok_namespace: str, kwok_operator: OperatorProcess
) -> None:
    ns = kwok_namespace
    kwok.apply(instance(ns, image=KUBESERVE_IMAGE))
    apps = [
        application(ns, f"app-{i}", "ks_composed_app:app", routePrefix=f"/a{i}")
        for i in range(APPS)
    ]
    for first in range(0, APPS, 10):  # one kubectl of 50 (100 requests) outlasted its minute
        kwok.apply(apps[first : first + 10])  # on a loaded machine, the operator writing meanwhile
    try:
        wait_for(lambda: ready_count(kwok, ns) == APPS, 300, interval_s=1, what=f"{APPS} Ready")
    except AssertionError as err:
        raise AssertionError(
            f"{err}: {ready_count(kwok, ns)} Ready\n{kwok_operator.log()}"
        ) from None
    # no finalizer (kopf's timers held one: a write at creation, another before deletion)
    listed = kwok.get("serveapplications", namespace=ns)["items"]
    assert [a["metadata"]["name"] for a in listed if a["metadata"].get("finalizers")] == []
    pods = kwok.get("pods", namespace=ns, selector="app.kubernetes.io/component=replica")["items"]
    assert len(pods) == APPS * 5
    assert len({p["spec"]["nodeName"] for p in pods}) > 1

    def changes(since: int) -> Counter[str]:
        return Counter(
            f"{r.verb} {r.resource}"
            for r in kwok.operator_requests(since)
            if r.is_write and r.resource != ELECTION
        )

    def quiet() -> bool:  # the operator's last writes of the roll-out are done
        mark = kwok.audit_mark()
        time.sleep(5)
        return not changes(mark)

    wait_for(quiet, 120, interval_s=0, what="5 s without a write of the operator")
    kwok.wait_settled(quiet_s=5.0, timeout_s=120.0)  # nor of the controllers catching up
    ours = objects_per_app(kwok, ns, selector=APPLICATION_LABEL)
    assert {k: v for k, v in ours.items() if k in OBJECTS_PER_APP} == OBJECTS_PER_APP, ours
    print(f"objects per application: {objects_per_app(kwok, ns)}")
    builds = kwok.get("jobs,configmaps", namespace=ns, selector=BUILDS)["items"]
    assert sorted(b["kind"] for b in builds) == ["ConfigMap", "Job"], builds  # one build for all
    graph = next(b for b in builds if b["kind"] == "ConfigMap")
    assert len(graph["metadata"]["ownerReferences"]) == APPS  # each application owns it
    events = Counter(
        f"{e.get('reportingComponent') or e['source'].get('component')} {e['reason']}"
        for e in kwok.get("events", namespace=ns)["items"]
    )
    print(f"events per application: { {k: round(v / APPS, 2) for k, v in events.items()} }")
    mark = kwok.audit_mark()
    skipped = metric(kwok_operator, "kubeserve_operator_resyncs_skipped_total")
    passes = metric(kwok_operator, "kubeserve_operator_reconciles_total")
    time.sleep(IDLE_WINDOW_S)  # the window measured: nothing to poll for
    writes = changes(mark)
    assert writes == Counter(), f"writes in {IDLE_WINDOW_S:.0f} s idle: {dict(writes)}"
    assert ready_count(kwok, ns) == APPS
    # every application's resync came once at least (one in ten is a full pass, the safety net)
    skipped = metric(kwok_operator, "kubeserve_operator_resyncs_skipped_total") - skipped
    passes = metric(kwok_operator, "kubeserve_operator_reconciles_total") - passes
    assert skipped >= APPS * 0.8, f"{passes} passes and {skipped} skipped resyncs when idle"
    assert passes <= APPS * 0.4, f"{passes} passes and {skipped} skipped resyncs when idle"

    # a write of the instance's status (its pass writes it as its applications change) wakes no
    # application: they read its spec (woken, all fifty passed at each write; a thousand with a
    # thousand applications, and one application's change waited behind them)
    passes = metric(kwok_operator, "kubeserve_operator_reconciles_total")
    kwok.kubectl("patch", "serveinstance", "default", "-n", ns, "--subresource=status",
                 "--type=merge", "-p", json.dumps({"status": {"message": "probe"}}))  # fmt: skip
    time.sleep(5)  # the window measured: nothing to poll for
    passes = metric(kwok_operator, "kubeserve_operator_reconciles_total") - passes
    assert passes < APPS / 2, f"{passes} passes after a write of the instance's status"

    # one application's change (a new build, every deployment rolls): its status is written when
    # it says something new, its progress paced (the count of the other applications': none)
    mark = kwok.audit_mark()
    patch = {"spec": {"runtimeEnv": {"envVars": {"CHANGED": "1"}}}}
    kwok.kubectl("patch", "serveapplication", "app-7", "-n", ns, "--type=merge",
                 "-p", json.dumps(patch))  # fmt: skip
    changed_at = time.monotonic()
    wait_for(lambda: ready_at_generation(kwok.get("serveapplication", "app-7", namespace=ns)), 120,
             interval_s=0.5, what="app-7 Ready after its change")  # fmt: skip
    took_s = time.monotonic() - changed_at
    wait_for(quiet, 120, interval_s=0, what="5 s without a write of the operator")
    statuses = Counter(
        r.name for r in kwok.operator_requests(mark)
        if r.verb == "patch" and r.resource == "serveapplications/status"
    )  # fmt: skip
    assert set(statuses) == {"app-7"}, f"status writes of a change of app-7: {dict(statuses)}"
    print(f"status writes of app-7's change: {statuses['app-7']} in {took_s:.1f} s")
    allowed = STATUS_WRITES_PER_CHANGE + int(took_s // PROGRESS_INTERVAL_S)
    assert statuses["app-7"] <= allowed, f"{dict(statuses)} in {took_s:.1f} s"
