"""The chart installed by Helm on the real node: the operator runs in a pod of the kubeserve image.

One release for the module (``helm install --wait``, uninstalled at the end), watching one
namespace. The operator pod runs with the chart's security context; an application it deploys is
served through the proxy Service's ClusterIP; the admin API answers through its own Service,
for the operator's namespace and, under ``/namespaces/<watched>``, to Ray's own client;
``helm upgrade`` to a new image tag replaces the operator without restarting any replica or proxy;
deleting the leading operator pod (of the chart's two) under load fails no request while the
other takes the Lease over, and so does killing its container with SIGKILL from the host
(another holder within 15 s, a later change reconciled); and the replicas' Lease requests are
classed by the chart's FlowSchema in the API server's leader-election priority level.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from support import ray_cli
from support.common import http, wait_for
from support.k8s_operator import TESTS_IMAGE, hello, proxy_service_url, ready_pods, text_answer
from support.kubeserve_install import CHART, find_helm
from support.node_cluster import KUBESERVE_IMAGE, NodeCluster
from support.node_recorder import (
    proxy_pods,
    proxy_replaced,
    recorder,
    replica_pods,
    settled,
    under_load,
)
from support.ray_cli import needs_ray_serve

pytestmark = pytest.mark.skipif(find_helm() is None, reason="helm comes from `make helm`")

RELEASE = "kubeserve"
UPGRADE_TAG = "0.1.0-upgrade"


@dataclass
class Release:
    node: NodeCluster
    namespace: str  # the operator's
    watched: str  # where its applications live

    def helm(self, *args: str, timeout: float = 180) -> str:
        helm = find_helm()
        assert helm is not None
        result = subprocess.run(
            [helm, *args, "--kubeconfig", str(self.node.kubeconfig), "--namespace", self.namespace],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result.stdout

    def install_or_upgrade(self, verb: str, tag: str = "", *values: str) -> None:
        """``helm install|upgrade --wait`` with the module's values, ``values`` (``a.b=c``) too."""
        settings = [arg for value in values for arg in ("--set", value)]
        self.helm(verb, RELEASE, str(CHART), "--wait", "--timeout", "150s",
                  "--set", f"watchNamespaces={{{self.watched}}}", "--set", "image.pullPolicy=Never",
                  "--set", f"image.tag={tag}", *settings)  # fmt: skip

    def operator_pods(self) -> list[dict[str, Any]]:
        return ready_pods(self.node, self.namespace, "app.kubernetes.io/name=kubeserve")

    def holder(self) -> str | None:
        """The Lease's ``holderIdentity``: ``<pod name>_<suffix>``, a new suffix per process (a
        restarted container keeps its pod's name, not its holder)."""
        lease = self.node.get("lease", f"{RELEASE}-operator", self.namespace)
        return lease["spec"].get("holderIdentity") or None

    def leader(self) -> str | None:
        """The operator pod holding the Lease."""
        return (self.holder() or "").rpartition("_")[0] or None


@pytest.fixture(scope="module")
def release(node: NodeCluster) -> Iterator[Release]:
    installed = Release(
        node, node.create_namespace("kubeserve-system"), node.create_namespace("apps")
    )
    installed.install_or_upgrade("install")
    yield installed
    installed.helm("uninstall", RELEASE, "--wait")
    for namespace in (installed.watched, installed.namespace):
        node.delete_namespace(namespace)


def deploy_hello(node: NodeCluster, namespace: str) -> str:
    """examples.hello behind the proxy Service; returns its URL there once it answers."""
    node.apply(hello(namespace))
    node.kubectl("wait", "--for=condition=Ready", "serveapplication/hello", "-n", namespace,
                 "--timeout=120s", timeout=130)  # fmt: skip
    return proxy_service_url(node, namespace, "/hello")


def test_operator_pod_serves_an_application_and_its_admin_api_through_services(
    release: Release,
) -> None:
    node = release.node
    pods = release.operator_pods()
    assert len(pods) == 2  # the chart's replicas: both serve the admin API, one leads
    assert release.leader() in {p["metadata"]["name"] for p in pods}
    pod = pods[0]
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    name = pod["metadata"]["name"]
    uid = node.kubectl("exec", name, "-n", release.namespace, "--", "id", "-u").stdout
    assert uid.strip() == "10001"
    url = deploy_hello(node, release.watched)
    assert text_answer(f"{url}?name=helm") == "hello, helm\n"
    admin = node.get("service", f"{RELEASE}-admin", release.namespace)["spec"]
    token = node.kubectl("create", "token", f"{RELEASE}-operator", "-n", release.namespace).stdout
    status, body = http(
        "GET", f"http://{admin['clusterIP']}:{admin['ports'][0]['port']}/api/serve/applications/",
        headers={"Authorization": f"Bearer {token.strip()}"},
    )  # fmt: skip
    assert status == 200, body
    assert "applications" in (body if isinstance(body, dict) else json.loads(body))


@needs_ray_serve
def test_the_ray_client_reads_a_watched_namespace_through_the_admin_service(
    release: Release,
) -> None:
    """Ray 2.60's ``serve`` client, unchanged, with ``-a http://<admin Service>:<port>/namespaces/
    <watched>``: it sees the watched namespace's application; the bare paths stay the operator's
    own namespace, which has none."""
    node = release.node
    deploy_hello(node, release.watched)
    admin = node.get("service", f"{RELEASE}-admin", release.namespace)["spec"]
    base = f"http://{admin['clusterIP']}:{admin['ports'][0]['port']}"
    token = node.kubectl("create", "token", f"{RELEASE}-operator", "-n", release.namespace).stdout
    status = yaml.safe_load(
        ray_cli.serve(f"{base}/namespaces/{release.watched}", "status", token=token.strip())
    )
    assert status["applications"]["hello"]["status"] == "RUNNING", status
    code, body = http(
        "GET", f"{base}/api/serve/applications/",
        headers={"Authorization": f"Bearer {token.strip()}"},
    )  # fmt: skip
    assert code == 200, body
    assert "hello" not in (body if isinstance(body, dict) else json.loads(body))["applications"]


def dispatched(node: NodeCluster, flow_schema: str) -> float:
    """Requests the API server dispatched under ``flow_schema`` (its own count, in /metrics)."""
    metrics = node.kubectl("get", "--raw", "/metrics").stdout
    pattern = (
        rf'^apiserver_flowcontrol_dispatched_requests_total{{[^}}]*flow_schema="{flow_schema}"'
    )
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if re.match(pattern, line) and 'priority_level="leader-election"' in line
    )


def test_the_operators_lease_requests_are_classed_in_the_leader_election_level(
    release: Release,
) -> None:
    """The chart's FlowSchema is in force (not dangling: the priority level exists), the
    operator's Lease update is classified under it (the API server names the FlowSchema in
    every answer) and the replicas' own renewals are dispatched through it."""
    node = release.node
    name = f"{RELEASE}-operator-leader-election"
    schema = node.get("flowschema", name)
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == "leader-election"
    conditions = {c["type"]: c["status"] for c in schema.get("status", {}).get("conditions", [])}
    assert conditions.get("Dangling") == "False", conditions
    level = node.get("prioritylevelconfiguration", "leader-election")
    account = f"system:serviceaccount:{release.namespace}:{RELEASE}-operator"
    update = node.kubectl(
        "patch", "lease", f"{RELEASE}-operator", "-n", release.namespace, "--as", account,
        "--type=merge", "-p", '{"metadata": {}}', "--dry-run=server", "-v=8",
    )  # fmt: skip
    classified = re.findall(r"X-Kubernetes-Pf-(Flowschema|Prioritylevel)-Uid: (\S+)",
                            update.stderr, re.IGNORECASE)  # fmt: skip
    assert classified, update.stderr[-2000:]
    assert {(kind.lower(), uid) for kind, uid in classified} == {
        ("flowschema", schema["metadata"]["uid"]),
        ("prioritylevel", level["metadata"]["uid"]),
    }
    # the operator's own renewals (every retry period) go through it too
    before = dispatched(node, name)
    wait_for(lambda: dispatched(node, name) > before, 30, what="renewals under the FlowSchema")
    # the rest of the operator's requests stay where they were: a list is not classified here
    listing = node.kubectl(
        "get", "pods", "-n", release.namespace, "--as", account, "-v=8", check=False
    )  # fmt: skip
    uids = re.findall(r"X-Kubernetes-Pf-Flowschema-Uid: (\S+)", listing.stderr, re.IGNORECASE)
    assert uids and schema["metadata"]["uid"] not in uids, listing.stderr[-2000:]


def replica_and_proxy_pods(node: NodeCluster, namespace: str) -> dict[str, int]:
    """uid -> restarts of every pod the operator made in ``namespace``."""
    pods = node.get("pods", namespace=namespace)["items"]
    return {
        p["metadata"]["uid"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
        for p in pods
    }


def test_helm_upgrade_to_a_new_image_tag_restarts_no_replica(release: Release) -> None:
    node = release.node
    url = deploy_hello(node, release.watched)
    before = replica_and_proxy_pods(node, release.watched)
    old_operators = {p["metadata"]["uid"] for p in release.operator_pods()}
    node.ctr("images", "tag", "--force", KUBESERVE_IMAGE,
             KUBESERVE_IMAGE.replace(":0.1.0", f":{UPGRADE_TAG}"))  # fmt: skip
    release.install_or_upgrade("upgrade", tag=UPGRADE_TAG)
    new_operators = wait_for(
        lambda: pods if len(pods := release.operator_pods()) == 2 else None,
        60,
        what="the upgraded operators Ready",
    )
    assert not {p["metadata"]["uid"] for p in new_operators} & old_operators
    for operator in new_operators:
        assert operator["spec"]["containers"][0]["image"] == f"kubeserve:{UPGRADE_TAG}"
    assert text_answer(url) == "hello, world\n"
    # The new operator has reconciled what it found: the application is still Ready, untouched.
    status = node.get("serveapplication", "hello", release.watched)["status"]
    assert status["appStatus"] == "RUNNING"
    assert replica_and_proxy_pods(node, release.watched) == before


def test_deleting_the_leading_operator_pod_under_load_fails_no_request(release: Release) -> None:
    """The data plane does not depend on the operator; the other replica takes over at once
    (the leader releases the Lease as it stops), and within 15 s even were it killed."""
    node = release.node
    url = deploy_hello(node, release.watched)
    leader = wait_for(release.leader, 30, what="a leading operator pod")
    stop, outcomes = threading.Event(), list[bool]()

    def client() -> None:
        while not stop.is_set():
            outcomes.append(text_answer(f"{url}?name=ha") == "hello, ha\n")

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        deleted = time.monotonic()
        node.kubectl("delete", "pod", leader, "-n", release.namespace, "--wait=false")
        successor = wait_for(
            lambda: name if (name := release.leader()) not in (None, leader) else None,
            15,
            interval_s=0.2,
            what="another operator pod holding the Lease",
        )
        took_over_s = time.monotonic() - deleted
        # The deleted pod stays Ready while it terminates, and the successor may be the pod that
        # replaces it (Ready only after its first probe): wait for exactly the successor and one
        # other, the deleted one gone.
        wait_for(
            lambda: (
                successor in (names := {p["metadata"]["name"] for p in release.operator_pods()})
                and leader not in names
                and len(names) == 2
            ),
            90,
            what="two operators Ready again, the successor among them",
        )
    finally:
        stop.set()
        for thread in clients:
            thread.join()
    assert len(outcomes) > 100 and outcomes.count(False) == 0, (
        f"{outcomes.count(False)} of {len(outcomes)} requests failed"
    )
    status = node.get("serveapplication", "hello", release.watched)["status"]
    assert status["appStatus"] == "RUNNING"
    print(f"leader pod deleted: successor after {took_over_s:.1f} s, {len(outcomes)} requests ok")


def deploy_recorder(release: Release, replicas: int = 2) -> str:
    """``fault_recorder`` with ``replicas`` replicas in the watched namespace, in place of
    examples.hello (which the module's earlier tests leave there: its pods would be counted),
    and its proxy Ready; the proxy Service's address."""
    node, ns = release.node, release.watched
    node.kubectl("delete", "serveapplication", "hello", "-n", ns, "--ignore-not-found",
                 "--wait=false")  # fmt: skip
    node.apply(recorder(ns, replicas))
    node.kubectl("wait", "--for=condition=Ready", "serveapplication/faults", "-n", ns,
                 "--timeout=120s", timeout=130)  # fmt: skip
    wait_for(
        lambda: settled(node, ns, replicas, set()) and proxy_replaced(node, ns, set(), TESTS_IMAGE),
        120,
        what=f"{replicas} replicas and the proxy Ready",
    )
    return proxy_service_url(node, ns, "/").split("//")[1].split(":")[0]


def reconciled(node: NodeCluster, ns: str, app: str) -> bool:
    """The operator has acted on ``app``'s latest spec: its status is of that generation and
    RUNNING."""
    obj = node.get("serveapplication", app, ns)
    status = obj.get("status") or {}
    return (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and status.get("appStatus") == "RUNNING"
    )


def test_killing_the_leading_operators_container_under_load_fails_no_request(
    release: Release,
) -> None:
    """SIGKILL of the leader's container from the host (``ctr tasks kill``: no SIGTERM, so the
    Lease is not released and the kubelet restarts the container in the same pod): under load
    through the proxy Service another holder takes the Lease within 15 s, no request fails,
    and a change made afterwards is reconciled by the new leader."""
    node, ns = release.node, release.watched
    host = deploy_recorder(release)
    holder = wait_for(release.holder, 30, what="a leading operator")
    pod_name = holder.rpartition("_")[0]
    (pod,) = [p for p in release.operator_pods() if p["metadata"]["name"] == pod_name]
    status = pod["status"]["containerStatuses"][0]
    container, restarts = (
        status["containerID"].removeprefix("containerd://"),
        status["restartCount"],
    )
    took: dict[str, float] = {}

    def kill_the_leader() -> None:
        killed = time.monotonic()
        node.ctr("tasks", "kill", "--signal", "SIGKILL", container)
        successor = wait_for(
            lambda: new if (new := release.holder()) not in (None, holder) else None,
            30,
            interval_s=0.2,
            what="another holder of the Lease",
        )
        took["takeover_s"] = time.monotonic() - killed
        print(f"Lease holder {holder} -> {successor} after {took['takeover_s']:.1f} s")

    def killed_container_back() -> bool:
        pods = release.operator_pods()  # Ready ones
        return len(pods) == 2 and any(
            p["metadata"]["name"] == pod_name
            and p["status"]["containerStatuses"][0]["restartCount"] > restarts
            for p in pods
        )

    failed = under_load(
        host, kill_the_leader, killed_container_back, "SIGKILL of the leading operator container"
    )
    assert failed == {}
    assert took["takeover_s"] < 15, f"another holder only after {took['takeover_s']:.1f} s"
    assert release.holder() not in (None, holder)
    # The new leader reconciles a change made now: a third replica.
    node.apply(recorder(ns, 3))
    wait_for(lambda: settled(node, ns, 3, set()), 120, what="the third replica Ready")
    wait_for(lambda: reconciled(node, ns, "faults"), 60, what="faults reconciled at 3 replicas")


def test_helm_upgrades_rolling_the_operator_then_the_data_plane_fail_no_request(
    release: Release,
) -> None:
    """Under load through the proxy Service: ``logLevel`` rolls only the operator pods; the
    admin Service's port (where proxies and replicas report load) rolls the operator, the
    proxy and every replica. No request fails. (Last in the module: it changes the release.)"""
    node, ns = release.node, release.watched
    host = deploy_recorder(release)
    figures = {}
    operators = {p["metadata"]["uid"] for p in release.operator_pods()}
    replicas = {p["metadata"]["name"] for p in replica_pods(node, ns)}
    proxies = {p["metadata"]["name"] for p in proxy_pods(node, ns)}

    def operators_replaced() -> bool:
        pods = release.operator_pods()
        return len(pods) == 2 and not {p["metadata"]["uid"] for p in pods} & operators

    figures["logLevel"] = under_load(
        host,
        lambda: release.install_or_upgrade("upgrade", "", "logLevel=DEBUG"),
        operators_replaced,
        "helm upgrade of logLevel (the operator rolls)",
    )
    assert {p["metadata"]["name"] for p in replica_pods(node, ns)} == replicas
    assert {p["metadata"]["name"] for p in proxy_pods(node, ns)} == proxies
    operators = {p["metadata"]["uid"] for p in release.operator_pods()}
    figures["admin.service.port"] = under_load(
        host,
        lambda: release.install_or_upgrade(
            "upgrade", "", "logLevel=DEBUG", "admin.service.port=8266"
        ),
        lambda: (
            operators_replaced()
            and settled(node, ns, 2, replicas)
            and proxy_replaced(node, ns, proxies, TESTS_IMAGE)
        ),
        "helm upgrade of admin.service.port (the operator, the proxy and the replicas roll)",
    )
    assert figures == {"logLevel": {}, "admin.service.port": {}}
