"""Two replicas of the operator against one API server: one leads (reconciles), both serve the
admin API; a killed leader is replaced within 15 s, a leader that loses its Lease stops writing.

The custom resource here is a ServeApplication whose instance does not exist: every pass over it
writes its status (observedGeneration, the Ready condition's message) and starts no pod, so the
tests watch the operators' writes and nothing else.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.common import wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import AdminApi, OperatorProcess, application

LEASE = "kubeserve-operator"
#: the chart's promise: a killed leader is replaced (the change reconciled) within this
FAILOVER_S = 15.0


@pytest.fixture
def replicas(
    control_plane: ControlPlane, crds: None, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    processes = [
        OperatorProcess(control_plane, namespace, tmp_path / f"operator-{i}.log") for i in range(2)
    ]
    try:
        for process in processes:
            process.start()
        yield processes
    finally:
        for process in processes:
            process.stop()


def leaders(operators: list[OperatorProcess]) -> list[OperatorProcess]:
    alive = [o for o in operators if o.proc is not None and o.proc.poll() is None]
    return [o for o in alive if o.metric("kubeserve_operator_leader") == 1]


def one_leader(operators: list[OperatorProcess]) -> OperatorProcess:
    return wait_for(
        lambda: found[0] if len(found := leaders(operators)) == 1 else None,
        30,
        interval_s=0.2,
        what="exactly one leading operator",
    )


def observed(plane: ControlPlane, namespace: str) -> tuple[int, str] | None:
    status = plane.get("serveapplication", "orphan", namespace).get("status") or {}
    if "observedGeneration" not in status:
        return None
    return int(status["observedGeneration"]), str(status.get("message"))


def point_at(plane: ControlPlane, namespace: str, instance: str) -> None:
    patch = json.dumps({"spec": {"instance": instance}})
    plane.kubectl(
        "patch", "serveapplication", "orphan", "-n", namespace, "--type", "merge", "-p", patch
    )


def test_one_replica_reconciles_and_a_killed_leader_is_replaced_within_15s(
    control_plane: ControlPlane, replicas: list[OperatorProcess], namespace: str
) -> None:
    plane = control_plane
    leader = one_leader(replicas)
    follower = next(o for o in replicas if o is not leader)
    plane.apply([application(namespace, "orphan", "e2e_probe:app", instance="first")])
    wait_for(
        lambda: (observed(plane, namespace) or (0, ""))[0] == 1, 30, what="generation 1 observed"
    )
    point_at(plane, namespace, "second")
    wait_for(
        lambda: observed(plane, namespace) == (2, "ServeInstance 'second' not found in namespace "
                                                  f"'{namespace}'"),
        30,
        what="generation 2 observed",
    )  # fmt: skip
    # exactly one reconciles: the follower has made no pass and sent no write
    assert leader.metric("kubeserve_operator_reconciles_total") >= 2
    assert leader.metric("kubeserve_operator_api_writes_total") >= 2
    assert follower.metric("kubeserve_operator_reconciles_total") == 0
    assert follower.metric("kubeserve_operator_api_writes_total") == 0
    # every replica answers the admin API from its own caches
    for operator in replicas:
        details = AdminApi(operator).details()
        assert "applications" in details, details

    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    killed = time.monotonic()
    point_at(plane, namespace, "third")
    wait_for(
        lambda: (observed(plane, namespace) or (0, ""))[0] == 3,
        FAILOVER_S,
        interval_s=0.2,
        what="the change reconciled by the surviving replica",
    )
    failover_s = time.monotonic() - killed
    assert leaders(replicas) == [follower]
    assert follower.metric("kubeserve_operator_reconciles_total") >= 1
    lease = plane.get("lease", LEASE, namespace)
    assert lease["spec"]["leaseTransitions"] >= 1
    assert AdminApi(follower).details()["applications"] is not None
    print(f"failover after SIGKILL of the leader: {failover_s:.1f} s")


def test_a_leader_that_loses_its_lease_stops_writing_until_it_wins_it_back(
    control_plane: ControlPlane, replicas: list[OperatorProcess], namespace: str
) -> None:
    plane = control_plane
    one_leader(replicas)
    plane.apply([application(namespace, "orphan", "e2e_probe:app", instance="first")])
    wait_for(lambda: (observed(plane, namespace) or (0, ""))[0] == 1, 30, what="generation 1")
    # another party takes the Lease, as a replica partitioned away would find on its return
    take = {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}}
    plane.kubectl(
        "patch", "lease", LEASE, "-n", namespace, "--type", "merge", "-p", json.dumps(take)
    )
    wait_for(lambda: not leaders(replicas), 10, interval_s=0.2, what="no replica leading")
    writes = {o.port: o.metric("kubeserve_operator_api_writes_total") for o in replicas}
    point_at(plane, namespace, "second")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # nobody may reconcile the change meanwhile
        assert (observed(plane, namespace) or (0, ""))[0] == 1
        time.sleep(0.5)
    assert {o.port: o.metric("kubeserve_operator_api_writes_total") for o in replicas} == writes
    # the intruder goes: one replica takes over at its next attempt and reconciles the change
    plane.kubectl("delete", "lease", LEASE, "-n", namespace)
    one_leader(replicas)
    wait_for(lambda: (observed(plane, namespace) or (0, ""))[0] == 2, 15, what="generation 2")


def test_a_stopping_leader_hands_over_at_once(
    control_plane: ControlPlane, replicas: list[OperatorProcess], namespace: str
) -> None:
    """SIGTERM (a rolling update, a drain): the leader releases the Lease as it stops."""
    plane = control_plane
    leader = one_leader(replicas)
    follower = next(o for o in replicas if o is not leader)
    leader.stop()
    stopped = time.monotonic()
    # released as it stopped: the Lease no longer names it (it may name the follower already)
    lease = plane.get("lease", LEASE, namespace)
    url = (lease["metadata"].get("annotations") or {}).get("kubeserve.io/leader-url", "")
    assert url in ("", f"http://127.0.0.1:{follower.port}"), lease
    wait_for(lambda: leaders([follower]) == [follower], 10, interval_s=0.1, what="a hand-over")
    handover_s = time.monotonic() - stopped  # a retry period at most; without the release, up
    # to the lease duration (8 s) after the last renewal
    assert follower.metric("kubeserve_operator_leader_terms_total") == 1
    assert follower.metric("kubeserve_operator_fence_shut_total") == 0
    plane.apply([application(namespace, "orphan", "e2e_probe:app", instance="first")])
    wait_for(lambda: (observed(plane, namespace) or (0, ""))[0] == 1, 15, what="generation 1")
    print(f"hand-over after the leader stopped on SIGTERM: {handover_s:.1f} s")
