"""A control plane whose nodes are kwok's: many fake nodes, thousands of pods, no kubelet.

:func:`start_kwok_cluster` runs etcd and the unpatched control plane of ``make k8s-node``
(kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1, plus kwok's controller
(``make kwok``), which takes every Node annotated ``kwok.x-k8s.io/node=fake`` (made by
:meth:`KwokCluster.add_nodes`), keeps it Ready, and moves the pods the scheduler binds to it through
their lifecycle: Running and Ready at once, a Job's pods Succeeded, deleted pods gone. No container
runs, so what a pod's process would do for kubeserve is done by :mod:`support.kwok_pods`.

Pod addresses: node ``i`` gets the pod CIDR ``10.252.<i>.0/24``, and the whole ``10.252.0.0/16``
is a ``local`` route on this machine while the cluster runs, so a process here can listen on a
pod's IP (EndpointSlices refuse loopback addresses). That route, and the fixed range, make the
cluster one per machine (a lock in /run) and need root.

The harness tunes its own control plane (never kubeserve's operator, which runs as users run it)
for a simulated cluster of thousands of pods on a 2-core machine: :data:`TUNING_LEVERS`.

Every request of the operator (its own token, user :data:`OPERATOR_USER`, or the chart's
ServiceAccount) is in the API server's audit log, so tests and the bench count its reads and
writes by verb and resource (:meth:`KwokCluster.operator_requests`) without a proxy in the way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.common import free_port, wait_for
from support.k8s_control_plane import (
    CACHE,
    ControlPlane,
    ProcessGroup,
    _answers_ok,
    _etcd_argv,
    find_etcd,
    kubeconfig_text,
    make_pki,
)
from support.node_cluster import NODE_BINARIES, find_node_bin_dir

KWOK_VERSION = "v0.7.0"
LOCK = Path("/run/kubeserve-kwok.lock")
POD_RANGE = "10.252.0.0/16"
OPERATOR_USER = "kubeserve-operator"
#: The chart's (and ``manifests/``') ServiceAccount of the operator, as the API server names it:
#: with ``start_kwok_cluster(operator_as_service_account=True)`` the operator's token is that
#: user, in the groups of a ServiceAccount token, and its rights are the ones the chart grants
#: (not ``system:masters``, which API Priority and Fairness exempts).
OPERATOR_SERVICE_ACCOUNT = "system:serviceaccount:kubeserve-system:kubeserve-operator"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: The label every fake node carries (tests select them, or subsets by their own labels).
FAKE_NODE_LABEL = "type"
#: pods (and nodes) kwok moves through a stage of their lifecycle at once
KWOK_PARALLELISM = 64
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: the write verbs of ``apiserver_request_total`` (server-side apply is ``APPLY``)
HTTP_WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
#: writes a cluster makes while nothing changes: Leases (the operator's, nodes'), nodes' status
#: heartbeats, the token and access reviews of a /metrics reader
HEARTBEATS = frozenset({"leases", "nodes/status", "tokenreviews", "subjectaccessreviews"})
#: The harness's levers on its control plane, all on unless ``KUBESERVE_KWOK_TUNING`` lists others
#: (comma-separated; ``none`` for the cluster untuned, to measure what each one is worth):
#:
#: - ``gogc``: ``GOGC=400`` for etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
#:   kwok. A roll-out of 1,000 applications keeps both cores busy from the first pod to the last,
#:   and the Go collector's share of that is the first thing a test cluster need not pay: memory
#:   is plentiful here (the API server holds about 3.3 GiB mid-run with it), CPU is not.
#: - ``tmpfs``: the cluster's files in /dev/shm: etcd's data directory (Debian's etcd 3.4 has no
#:   ``--unsafe-no-fsync``, and every commit waits for an fsync of its WAL) and the API server's
#:   audit log (blocking mode, written in the path of each audited request). The data is thrown
#:   away at the end anyway.
TUNING_LEVERS = ("gogc", "tmpfs")
GOGC = "400"
SHM = Path("/dev/shm")


def tuning() -> frozenset[str]:
    """The levers of :data:`TUNING_LEVERS` in use (``KUBESERVE_KWOK_TUNING``; all by default)."""
    chosen = os.environ.get("KUBESERVE_KWOK_TUNING")
    if chosen is None:
        return frozenset(TUNING_LEVERS)
    levers = frozenset(x.strip() for x in chosen.split(",") if x.strip() not in ("", "none"))
    if unknown := levers - set(TUNING_LEVERS):
        raise ValueError(
            f"KUBESERVE_KWOK_TUNING: unknown {sorted(unknown)}, not in {TUNING_LEVERS}"
        )
    return levers


def find_kwok() -> Path | None:
    """``KUBESERVE_KWOK`` if set, else the cached build of ``make kwok``."""
    if os.environ.get("KUBESERVE_KWOK"):
        return Path(os.environ["KUBESERVE_KWOK"])
    path = CACHE.parent / "kwok" / KWOK_VERSION / "kwok"
    return path if path.exists() else None


def kwok_missing() -> str | None:
    """Why a kwok cluster cannot start here (None when it can)."""
    if os.environ.get("KUBESERVE_K8S_NODE") != "1":
        return "the kwok tier runs with the Kubernetes tier: `make test` sets KUBESERVE_K8S_NODE=1"
    if os.geteuid() != 0:
        return "the kwok cluster routes its pod addresses to this machine: it needs root"
    bin_dir = find_node_bin_dir()
    needed = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    if bin_dir is None or any(not (bin_dir / b).exists() for b in needed):
        return "no control-plane binaries: run `make k8s-node`"
    assert set(needed) <= set(NODE_BINARIES)
    if find_etcd(bin_dir) is None:
        return "no etcd: run `make k8s-node`"
    if find_kwok() is None:
        return "no kwok: run `make kwok`"
    return None


@dataclass(frozen=True)
class AuditedRequest:
    """One request of the operator, from the API server's audit log."""

    verb: str
    resource: str
    namespace: str
    name: str

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS


@dataclass
class KwokCluster(ControlPlane):
    """A running kwok cluster; ``operator_kubeconfig`` authenticates as ``operator_user``
    (:data:`OPERATOR_USER`, or the chart's ServiceAccount: :data:`OPERATOR_SERVICE_ACCOUNT`)."""

    operator_kubeconfig: Path = field(default=Path(), repr=False)
    operator_user: str = OPERATOR_USER
    audit_log: Path = field(default=Path(), repr=False)
    nodes: list[str] = field(default_factory=list)

    def add_nodes(
        self,
        count: int,
        labels: Mapping[str, str] | None = None,
        prefix: str = "kwok-node",
        cpu: str = "128",
    ) -> list[str]:
        """``count`` fake nodes (``<prefix>-<n>``), each with ``labels`` and room for 250 pods;
        waits until kwok reports them all Ready."""
        names = []
        for _ in range(count):
            index = len(self.nodes)
            if index > 255:
                raise ValueError("the pod range has room for 256 nodes")
            name = f"{prefix}-{index}"
            self.nodes.append(name)
            names.append(name)
            capacity = {"cpu": cpu, "memory": "1Ti", "pods": "250"}
            self.api("POST", "/api/v1/nodes", {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                               "kubernetes.io/arch": "amd64", FAKE_NODE_LABEL: "kwok",
                               **(labels or {})},
                },
                "spec": {"podCIDR": f"10.252.{index}.0/24", "podCIDRs": [f"10.252.{index}.0/24"]},
                "status": {"capacity": capacity, "allocatable": capacity},
            })  # fmt: skip
        for name in names:
            wait_for(lambda name=name: self.node_ready(name), 60, what=f"fake node {name} Ready")
        return names

    # -- the operator's requests ------------------------------------------------------------------
    def audit_mark(self) -> int:
        """A position in the audit log: :meth:`operator_requests` counts from one."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def operator_requests(self, since: int = 0) -> list[AuditedRequest]:
        """The operator's completed requests logged after ``since`` (watches count when they
        end)."""
        with self.audit_log.open("rb") as log:
            log.seek(since)
            data = log.read()
        found = []
        for line in data.splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # a line being written
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", ""))
            if ref.get("subresource"):
                resource = f"{resource}/{ref['subresource']}"
            found.append(
                AuditedRequest(
                    event["verb"], resource, ref.get("namespace", ""), ref.get("name", "")
                )
            )
        return found

    # -- every client's writes --------------------------------------------------------------------
    def cluster_writes(self) -> int:
        """Every client's writes so far (the API server's ``apiserver_request_total``), the
        heartbeats of :data:`HEARTBEATS` aside."""
        import re
        import ssl
        import urllib.request

        request = urllib.request.Request(
            f"{self.server}/metrics", headers={"Authorization": f"Bearer {self.token}"}
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, timeout=60, context=context) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource = f"{resource}/{labels['subresource']}"
            if labels.get("verb") in HTTP_WRITES and resource not in HEARTBEATS:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def wait_settled(
        self, since: float | None = None, quiet_s: float = 10.0, timeout_s: float = 900.0
    ) -> float:
        """Wait until no client has written for ``quiet_s`` (:data:`HEARTBEATS` aside); the
        seconds from ``since`` (a ``time.monotonic()``, default now) to the last write seen (to
        within the 2 s between polls). Applications are Ready before the controller-manager has
        caught up with their pods (Deployment, ReplicaSet, PodDisruptionBudget, Endpoints and
        EndpointSlice status, Events: at 1,000 applications two minutes of 1.2-1.6 cores after
        all were Ready); an idle window measured before that measures the catching up, and the
        operator's passes its Deployments' status changes wake."""
        start = time.monotonic()
        since = start if since is None else since
        last, changed = self.cluster_writes(), since
        while time.monotonic() - changed < quiet_s:
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"the cluster still writing after {timeout_s:.0f} s")
            time.sleep(2.0)
            count = self.cluster_writes()
            if count != last:
                last, changed = count, time.monotonic()
        return round(changed - since, 1)


# -- start-up -------------------------------------------------------------------------------------
@contextlib.contextmanager
def start_kwok_cluster(
    timeout_s: float = 120.0, operator_as_service_account: bool = False
) -> Iterator[KwokCluster]:
    """Start the cluster (no nodes yet: :meth:`KwokCluster.add_nodes`), yield it, stop it and
    remove its route and files. ``operator_as_service_account``: the operator's token is the
    chart's ServiceAccount's (:data:`OPERATOR_SERVICE_ACCOUNT`; its RBAC is the caller's to
    apply)."""
    reason = kwok_missing()
    if reason is not None:
        raise RuntimeError(reason)
    bin_dir, kwok = find_node_bin_dir(), find_kwok()
    assert bin_dir is not None and kwok is not None
    etcd = find_etcd(bin_dir)
    assert etcd is not None
    levers = tuning()
    base = str(SHM) if "tmpfs" in levers and SHM.is_dir() else None
    with _lock(), tempfile.TemporaryDirectory(prefix="kubeserve-kwok-", dir=base) as tmp:
        work = Path(tmp)
        processes = _TunedProcesses(work, levers)
        _route(add=True)
        try:
            cluster = _credentials(bin_dir, work, processes, operator_as_service_account)
            _start(cluster, etcd, kwok, timeout_s)
            yield cluster
        finally:
            processes.stop_all()
            _route(add=False)
            if os.environ.get("KUBESERVE_K8S_KEEP") == "1":
                shutil.copytree(work, Path(tempfile.gettempdir()) / f"kwok-logs-{int(time.time())}")


class _TunedProcesses(ProcessGroup):
    """The cluster's processes, started with the environment of :data:`TUNING_LEVERS`."""

    def __init__(self, log_dir: Path, levers: frozenset[str]) -> None:
        super().__init__(log_dir)
        self.levers = levers

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        if "gogc" in self.levers:
            env = {**(os.environ if env is None else env), "GOGC": GOGC}
        super().start(name, argv, env)


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another session's kwok cluster: wait for it
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _route(add: bool) -> None:
    """The pods' addresses as local ones (a crashed run's route is replaced)."""
    subprocess.run(["ip", "route", "del", "local", POD_RANGE, "dev", "lo"], capture_output=True)
    if add:
        subprocess.run(["ip", "route", "add", "local", POD_RANGE, "dev", "lo"], check=True)


def _credentials(
    bin_dir: Path, work: Path, processes: ProcessGroup, operator_as_service_account: bool
) -> KwokCluster:
    pki = work / "pki"
    make_pki(pki)
    tokens = {name: secrets.token_hex(24) for name in ("admin", "operator", "kwok")}
    user, groups = OPERATOR_USER, "system:masters"
    if operator_as_service_account:
        namespace = OPERATOR_SERVICE_ACCOUNT.split(":")[2]
        user = OPERATOR_SERVICE_ACCOUNT
        groups = f"system:serviceaccounts,system:serviceaccounts:{namespace}"
    (pki / "tokens.csv").write_text(
        f'{tokens["admin"]},kubeserve-admin,kubeserve-admin,"system:masters"\n'
        f'{tokens["operator"]},{user},{user},"{groups}"\n'
        f'{tokens["kwok"]},kwok-controller,kwok-controller,"system:masters"\n'
    )
    server, ca = f"https://127.0.0.1:{free_port()}", pki / "ca.crt"
    for name, token in tokens.items():
        (work / f"{name}.kubeconfig").write_text(kubeconfig_text(server, str(ca), token))
    return KwokCluster(bin_dir, work, server, work / "admin.kubeconfig", tokens["admin"], ca,
                       processes=processes, operator_kubeconfig=work / "operator.kubeconfig",
                       operator_user=user, audit_log=work / "audit.log")  # fmt: skip


def _start(cluster: KwokCluster, etcd: str, kwok: Path, timeout_s: float) -> None:
    processes, work, bin_dir = cluster.processes, cluster.work_dir, cluster.bin_dir
    assert processes is not None

    def start(name: str, argv: list[str], probe: Any) -> None:
        processes.start(name, argv)

        def ready() -> bool:
            processes.check(name)
            return bool(probe())

        wait_for(ready, timeout_s, interval_s=0.1, what=f"{name} ready")

    etcd_port = free_port()
    start("etcd", _etcd_argv(etcd, work / "etcd", etcd_port, free_port()),
          lambda: _answers_ok(f"http://127.0.0.1:{etcd_port}/health"))  # fmt: skip
    ready = (cluster.server, cluster.token, cluster.ca_file)
    start("kube-apiserver", _apiserver_argv(cluster, etcd_port),
          lambda: _answers_ok(f"{ready[0]}/readyz", *ready[1:]))  # fmt: skip
    pki, kubeconfig = work / "pki", cluster.kubeconfig
    common = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
              f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
              "--leader-elect=false", "--profiling=false"]  # fmt: skip
    # The client rate limits of a cluster sized for thousands of pods (the defaults, 20 requests
    # per second, would make the controllers the bottleneck of every figure).
    manager_port, scheduler_port = free_port(), free_port()
    start("kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"), *common, f"--secure-port={manager_port}",
        f"--cert-dir={work / 'controller-manager'}", "--controllers=*",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        "--service-cluster-ip-range=10.96.0.0/16", "--cluster-name=kubeserve-kwok",
        "--kube-api-qps=500", "--kube-api-burst=1000", "--concurrent-deployment-syncs=20",
        "--concurrent-replicaset-syncs=20", "--concurrent-service-endpoint-syncs=20",
        # kwok heartbeats its nodes through their status (no Leases), from a busy 2-core
        # machine: ten minutes apart in a run of 1,000 applications, when a grace period of
        # 600 s made the node lifecycle controller mark every pod unready (kwok never makes it
        # Ready again). Nodes do not fail here; an hour covers the longest bench run.
        "--node-monitor-grace-period=3600s",
    ], lambda: _answers_ok(f"https://127.0.0.1:{manager_port}/healthz"))  # fmt: skip
    scheduler_config = work / "scheduler.yaml"
    scheduler_config.write_text(json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 500, "burst": 1000},
        "leaderElection": {"leaderElect": False},
    }))  # fmt: skip
    start("kube-scheduler", [
        str(bin_dir / "kube-scheduler"), f"--config={scheduler_config}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
    ], lambda: _answers_ok(f"https://127.0.0.1:{scheduler_port}/healthz"))  # fmt: skip
    # kwok moves 4 pods through a stage at a time by default: with each status update taking a
    # second of a busy API server, a thousand applications' pods came up at one or two a second.
    kwok_config = work / "kwok.yaml"
    kwok_config.write_text(json.dumps({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {"podPlayStageParallelism": KWOK_PARALLELISM,
                    "nodePlayStageParallelism": KWOK_PARALLELISM},
    }))  # fmt: skip
    processes.start("kwok", [
        str(kwok), f"--kubeconfig={work / 'kwok.kubeconfig'}", f"--config={kwok_config}",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
        "--node-ip=127.0.0.1", "--cidr=10.252.255.0/24", "--v=WARN",
    ])  # fmt: skip
    wait_for(
        lambda: cluster.exists("serviceaccount", "default", "default"),
        timeout_s,
        what="the default service account",
    )


def _apiserver_argv(cluster: KwokCluster, etcd_port: int) -> list[str]:
    pki, work = cluster.work_dir / "pki", cluster.work_dir
    policy = work / "audit-policy.yaml"
    policy.write_text(json.dumps({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": [cluster.operator_user]}, {"level": "None"}],
    }))  # fmt: skip
    port = cluster.server.rsplit(":", 1)[1]
    return [
        str(cluster.bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={work / 'apiserver'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--endpoint-reconciler-type=none",  # its address is a loopback one: no Endpoints
        # Debian's etcd (3.4.23) cannot serve the progress requests of streaming lists, which kwok
        # asks for: every one of its watches would end at once and be re-listed after a backoff.
        "--feature-gates=WatchList=false",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={cluster.audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        "--profiling=false",
    ]
