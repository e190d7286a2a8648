"""Test support: a real single-node Kubernetes cluster on this machine, pods in real containers.

``start_node_cluster()`` runs, as root, etcd and the unpatched control plane (``make k8s-node``
builds it with the node binaries), containerd (Debian's, with runc), the kubelet, kube-proxy
(nftables mode) and CoreDNS. Pods get addresses on the bridge ``ksnode0`` (10.244.0.0/24, the host
is 10.244.0.1) with no default route and no masquerading, so nothing a pod sends can leave the
machine; Service ClusterIPs (10.96.0.0/16) are routed from the host and from pods to the bridge,
where kube-proxy translates them. Nothing listens beyond 127.0.0.1 and 10.244.0.1: the API server
and the kubelet API on the bridge address (they must be reachable from pods), the rest on loopback.
CoreDNS answers ``cluster.local`` and the reverse zones and forwards nothing.

Images come from ``make k8s-node`` too (``node/build_images.sh``): the pause image, and the
kubeserve image built from the repository's Dockerfile, imported into containerd at start.

One cluster per machine: its names are fixed (the bridge, the directory ``BASE``, the cgroup
``/kubeserve-node``, kube-proxy's nftables tables), so a second test session waits for the first
one's lock. ``clean_node()`` removes everything the cluster makes on the machine, whether it stopped
or crashed: it runs before every start and after every stop. What it removes is recognisable as the
cluster's own: processes whose command line names ``BASE``, mounts under ``BASE`` and the network
namespaces of its pods, the cgroup ``/kubeserve-node`` in every hierarchy, the bridge, kube-proxy's
nftables tables and iptables chains named ``KUBE-*``, the (then empty) iptables-nft tables and the
runtime's directories that were not there before; the two sysctls it sets are put back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.common import free_port, wait_for
from support.k8s_control_plane import (
    ADMIN_USER,
    SERVICE_CIDR,
    ControlPlane,
    ProcessGroup,
    _answers_ok,
    _etcd_argv,
    find_etcd,
    kubeconfig_text,
    make_pki,
    sign_certificate,
)

CACHE = Path.home() / ".cache" / "kubeserve"
BASE = Path("/var/lib/kubeserve-node")
LOCK = Path("/run/kubeserve-node.lock")
#: What the machine looked like before the first start (sysctls, nftables tables), for clean_node().
BEFORE = Path("/run/kubeserve-node.before.json")
NODE_NAME = "kubeserve-node"
BRIDGE = "ksnode0"
POD_CIDR = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
API_PORT = 6443
KUBELET_PORT = 10250
CGROUP = "kubeserve-node"
CNI_NETWORK = "kubeserve-node"
PAUSE_IMAGE = "kubeserve.local/pause:3.10"
KUBESERVE_IMAGE = "docker.io/library/kubeserve:0.1.0"
NODE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
                 "kubelet", "kube-proxy")  # fmt: skip
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables")


def find_node_bin_dir() -> Path | None:
    """``KUBESERVE_K8S_NODE_BIN`` if set, else the newest cached node build; None when not built."""
    if os.environ.get("KUBESERVE_K8S_NODE_BIN"):
        return Path(os.environ["KUBESERVE_K8S_NODE_BIN"])
    stamps = sorted((CACHE / "k8s").glob("v*/node-bin/.stamp"))
    return stamps[-1].parent if stamps else None


def find_coredns() -> Path | None:
    found = sorted((CACHE / "coredns").glob("v*/coredns"))
    return found[-1] if found else None


def node_missing(bin_dir: Path | None) -> str | None:
    """Why a node cluster cannot start here (None when it can): the Kubernetes tier runs when
    ``KUBESERVE_K8S_NODE=1`` (``make test`` and ``make test-node`` set it), as root."""
    if os.environ.get("KUBESERVE_K8S_NODE") != "1":
        return (
            "the Kubernetes tier runs on a real node made on this machine: `make test` or "
            "`make test-node` (they set KUBESERVE_K8S_NODE=1), as root"
        )
    if os.geteuid() != 0:
        return (
            "the Kubernetes tier's node (containerd, kubelet, a network bridge) needs root: "
            "run `make test` as root to run it"
        )
    if bin_dir is None or any(not (bin_dir / b).exists() for b in NODE_BINARIES):
        return "no node binaries: run `make k8s-node`"
    for tool in ("containerd", "runc", "ctr", "nft", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run `make k8s-node`"
    images = CACHE / "node" / "images"
    if find_coredns() is None or not (images / "kubeserve-tests.tar").exists():
        return "no CoreDNS or images: run `make k8s-node`"
    return None


def _run(*argv: str, check: bool = True, input: str | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


@dataclass
class NodeCluster(ControlPlane):
    """A running node cluster: everything ``ControlPlane`` offers, with real pods behind it."""

    health_ports: dict[str, int] = field(default_factory=dict, repr=False)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        args = ["logs", pod, "-n", namespace, *(["-c", container] if container else [])]
        return self.kubectl(*args, check=False).stdout

    def ctr(self, *args: str, check: bool = True) -> str:
        """``ctr`` against the node's containerd, in the kubelet's ``k8s.io`` namespace."""
        return _run("ctr", "--address", str(BASE / "containerd.sock"), "-n", "k8s.io", *args,
                    check=check)  # fmt: skip

    def restart_kubelet(self) -> None:
        """Stop the kubelet if it runs (its pods keep running) and start it with the same
        settings."""
        assert self.processes is not None
        self.processes.stop("kubelet")
        self.processes.start("kubelet", _kubelet_argv(self.bin_dir))
        wait_for(lambda: self.node_ready(NODE_NAME), 60, what="the node Ready again")

    def start_kubelet(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the node cluster has exactly one node")


# -- clean-up -------------------------------------------------------------------------------------
def clean_node(keep_logs: bool = False) -> None:
    """Remove every trace of a node cluster from the machine (idempotent; see the module docstring);
    ``keep_logs`` leaves the files in BASE (the next start removes them).

    Order matters: processes first (the kubelet would restart containers, containerd would restart
    shims), then what they held (mounts, network namespaces, cgroups), then the network plumbing.
    """
    _kill_processes()
    _unmount_all()
    _remove_cgroups()
    _run("ip", "link", "delete", BRIDGE, check=False)
    for family in ("ip", "ip6"):
        _run("nft", "delete", "table", family, "kube-proxy", check=False)
        _run("nft", "delete", "table", family, "kube-proxy-canary", check=False)
    _remove_kube_iptables_chains()
    _restore_machine()
    for link in Path("/var/log/containers").glob("*.log"):
        if str(BASE) in os.readlink(link) if link.is_symlink() else False:
            link.unlink()
    for result in Path("/var/lib/cni/results").glob("*"):  # only this cluster uses CNI here
        result.unlink()
    _remove_shim_sockets()
    # Directories the runtime makes on first use; removed when nothing else put anything there.
    for directory in ("/run/containerd/s", "/run/containerd", "/run/netns", "/var/log/containers",
                      "/var/lib/cni/results", "/var/lib/cni"):  # fmt: skip
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    if not keep_logs:
        shutil.rmtree(BASE, ignore_errors=True)


def _processes_of_node() -> list[int]:
    """Processes whose command line names BASE (every daemon and shim) or that live in the pods'
    cgroup tree."""
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(BASE).encode() in (proc / "cmdline").read_bytes():
                pids.add(int(proc.name))
    for procs in Path("/sys/fs/cgroup").glob(f"*/{CGROUP}/**/cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(line) for line in procs.read_text().split())
    return sorted(pids)


def _kill_processes() -> None:
    for _ in range(50):
        pids = _processes_of_node()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes of the node cluster survive SIGKILL: {_processes_of_node()}")


def _remove_shim_sockets() -> None:
    """containerd 1.6 puts its shims' sockets in /run/containerd/s whatever its state directory; a
    killed shim leaves its socket behind. Removed only while no containerd at all runs here."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a zombie's command line is empty
            if Path(cmdline.read_bytes().split(b"\0")[0].decode()).name.startswith("containerd"):
                return
    for socket in Path("/run/containerd/s").glob("*"):
        with contextlib.suppress(OSError):
            socket.unlink()


def _unmount_all() -> None:
    """Unmount, deepest first, everything under BASE and the pods' network namespaces (which CRI
    names ``cni-<uuid>`` in /run/netns; nothing else on this machine makes such names)."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    ours = [
        m
        for m in mounts
        if m.startswith(f"{BASE}/") or re.fullmatch(r"/(var/)?run/netns/cni-[0-9a-f-]+", m)
    ]
    for mount in sorted(set(ours), key=len, reverse=True):
        _run("umount", "--lazy", mount, check=False)
    for netns in Path("/run/netns").glob("cni-*"):
        with contextlib.suppress(OSError):
            netns.unlink()


def _remove_cgroups() -> None:
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        root = hierarchy / CGROUP
        if not root.is_dir():
            continue
        for directory in sorted(
            (p for p in root.glob("**/") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()


def _remove_kube_iptables_chains() -> None:
    """Chains named ``KUBE-*`` (the kubelet's and kube-proxy's; nothing else here uses the
    prefix), after the rules in other chains that jump to them."""
    for save, tool in (("iptables-save", "iptables"), ("ip6tables-save", "ip6tables")):
        if shutil.which(save) is None:
            continue
        table = ""
        chains: dict[str, list[str]] = {}
        for line in _run(save, check=False).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.setdefault(table, []).append(line[1:].split()[0])
            elif line.startswith("-A ") and " -j KUBE-" in line and not line.startswith("-A KUBE-"):
                _run(tool, "-t", table, "-D", *line[3:].split(), check=False)
        for table, names in chains.items():
            for name in names:
                _run(tool, "-t", table, "-F", name, check=False)
            for name in names:
                _run(tool, "-t", table, "-X", name, check=False)


def _nft_tables() -> list[str]:
    """``family name`` of every nftables table (iptables-nft keeps its tables there too)."""
    return [" ".join(line.split()[1:3]) for line in _run("nft", "list", "tables").splitlines()]


def _nft_table_empty(table: str) -> bool:
    listing = json.loads(_run("nft", "-j", "list", "table", *table.split(), check=False) or "{}")
    return not any("rule" in item for item in listing.get("nftables", []))


def _record_machine() -> None:
    """Note the sysctls and nftables tables as they are, unless a crashed run already did (then
    its notes are the truth), and set the sysctls the node needs."""
    if not BEFORE.exists():
        sysctls = {k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS}
        BEFORE.write_text(json.dumps({"sysctls": sysctls, "nft_tables": _nft_tables()}))
    for key in SYSCTLS:
        Path("/proc/sys", key).write_text("1\n")


def _restore_machine() -> None:
    """Put the sysctls back; drop the (empty) iptables-nft tables the kubelet's chains brought."""
    if not BEFORE.exists():
        return
    before = json.loads(BEFORE.read_text())
    for key, value in before["sysctls"].items():
        Path("/proc/sys", key).write_text(f"{value}\n")
    for table in set(_nft_tables()) - set(before["nft_tables"]):
        if _nft_table_empty(table):
            _run("nft", "delete", "table", *table.split(), check=False)
    BEFORE.unlink()


# -- start-up -------------------------------------------------------------------------------------
class NodeBusy(RuntimeError):
    """Another test session's node cluster holds the machine-wide lock."""


@contextlib.contextmanager
def node_lock(timeout_s: float) -> Iterator[None]:
    """The machine-wide lock of the node cluster: one at a time (its names are fixed); raises
    ``NodeBusy`` when not free within ``timeout_s``."""
    with LOCK.open("a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NodeBusy(
                        f"another node cluster held {LOCK} for {timeout_s:.0f} s"
                    ) from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def start_node_cluster(
    bin_dir: Path, timeout_s: float = 120.0, lock_timeout_s: float = 1800.0
) -> Iterator[NodeCluster]:
    """Start the cluster (cleaning any leftovers first), yield it once the node is Ready with DNS
    and Service routing in place, and leave the machine clean afterwards."""
    etcd, coredns = find_etcd(bin_dir), find_coredns()
    if etcd is None or coredns is None:
        raise RuntimeError("etcd or CoreDNS missing: run `make k8s-node`")
    with node_lock(lock_timeout_s):
        clean_node()
        BASE.mkdir(parents=True)
        processes = ProcessGroup(BASE / "logs")
        processes.log_dir.mkdir()
        try:
            yield _start(bin_dir, etcd, coredns, processes, timeout_s)
        finally:
            # Nothing of the cluster is kept, so no daemon needs a graceful stop: SIGKILL them all
            # at once (clean_node), then reap them.
            clean_node(keep_logs=os.environ.get("KUBESERVE_K8S_KEEP") == "1")
            processes.stop_all()


def _start(
    bin_dir: Path, etcd: str, coredns: Path, processes: ProcessGroup, timeout_s: float
) -> NodeCluster:
    cluster = _credentials(bin_dir, processes)
    starter = _Starter(processes, timeout_s)
    _record_machine()
    _make_bridge()
    _start_control_plane(cluster, starter, etcd)
    _start_node(cluster, starter)
    _start_cluster_services(cluster, starter, coredns)
    return cluster


@dataclass
class _Starter:
    """Starts a daemon and waits until its probe passes, failing early with its log if it exits."""

    processes: ProcessGroup
    timeout_s: float

    def start(self, name: str, argv: list[str], probe: Any, what: str) -> None:
        self.processes.start(name, argv)
        self.ready(name, probe, what)

    def ready(self, name: str, probe: Any, what: str) -> None:
        def check() -> bool:
            self.processes.check(name)
            return bool(probe())

        try:
            wait_for(check, self.timeout_s, interval_s=0.1, what=what)
        except AssertionError as err:
            raise RuntimeError(f"{err}\n{self.processes.tail(name)}") from None


def _credentials(bin_dir: Path, processes: ProcessGroup) -> NodeCluster:
    """Certificates, a token each for the admin, the kubelet (a member of ``system:nodes``, for
    the Node authorizer) and kube-proxy, and their kubeconfigs."""
    pki = BASE / "pki"
    make_pki(pki, extra_names=[f"IP:{NODE_IP}"])
    sign_certificate(pki, "kubelet-client", "/CN=kube-apiserver-kubelet-client/O=system:masters")
    sign_certificate(pki, "kubelet", f"/CN={NODE_NAME}", [f"IP:{NODE_IP}", f"DNS:{NODE_NAME}"])
    tokens = {name: secrets.token_hex(24) for name in ("admin", "kubelet", "kube-proxy")}
    (pki / "tokens.csv").write_text(
        f'{tokens["admin"]},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        f'{tokens["kubelet"]},system:node:{NODE_NAME},{NODE_NAME},"system:nodes"\n'
        f"{tokens['kube-proxy']},system:kube-proxy,kube-proxy\n"
    )
    server, ca = f"https://{NODE_IP}:{API_PORT}", pki / "ca.crt"
    for name, token in tokens.items():
        (BASE / f"{name}.kubeconfig").write_text(kubeconfig_text(server, str(ca), token))
    return NodeCluster(bin_dir, BASE, server, BASE / "admin.kubeconfig", tokens["admin"], ca,
                       node_name=NODE_NAME, processes=processes)  # fmt: skip


def _start_control_plane(cluster: NodeCluster, starter: _Starter, etcd: str) -> None:
    """etcd and the API server, then the controller manager and the scheduler (whose readiness
    ``_start_cluster_services`` checks, so they start while the node does)."""
    etcd_port, peer_port = free_port(), free_port()
    etcd_argv = _etcd_argv(etcd, BASE / "etcd", etcd_port, peer_port)
    starter.start("etcd", etcd_argv, lambda: _answers_ok(f"http://127.0.0.1:{etcd_port}/health"),
                  "etcd health")  # fmt: skip
    starter.start("kube-apiserver", _apiserver_argv(cluster.bin_dir, etcd_port),
                  lambda: _answers_ok(f"{cluster.server}/readyz", cluster.token, cluster.ca_file),
                  "kube-apiserver /readyz")  # fmt: skip
    pki, kubeconfig = BASE / "pki", cluster.kubeconfig
    common = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
              f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
              "--leader-elect=false", "--profiling=false"]  # fmt: skip
    cluster.health_ports = {"kube-controller-manager": free_port(), "kube-scheduler": free_port()}
    starter.processes.start("kube-controller-manager", [
        str(cluster.bin_dir / "kube-controller-manager"), *common,
        f"--secure-port={cluster.health_ports['kube-controller-manager']}",
        f"--cert-dir={BASE / 'controller-manager'}", "--controllers=*",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--cluster-name=kubeserve-node",
    ])  # fmt: skip
    starter.processes.start("kube-scheduler", [
        str(cluster.bin_dir / "kube-scheduler"), *common,
        f"--secure-port={cluster.health_ports['kube-scheduler']}",
    ])  # fmt: skip


def _start_node(cluster: NodeCluster, starter: _Starter) -> None:
    """containerd with the images imported, then the kubelet, until the node is Ready."""
    starter.start("containerd", ["containerd", "--config", str(_containerd_config())],
                  lambda: cluster.ctr("version", check=False), "containerd answering")  # fmt: skip
    for archive in ("pause.tar", "kubeserve.tar", "kubeserve-tests.tar"):
        cluster.ctr("images", "import", "--no-unpack", str(CACHE / "node" / "images" / archive))
    _write_cni_config()
    _write_kubelet_config(str(cluster.ca_file))
    _make_cgroups()
    starter.start("kubelet", _kubelet_argv(cluster.bin_dir),
                  lambda: cluster.node_ready(NODE_NAME), f"node {NODE_NAME} Ready")  # fmt: skip


def _start_cluster_services(cluster: NodeCluster, starter: _Starter, coredns: Path) -> None:
    """kube-proxy and CoreDNS; then wait for the controllers (the default service account)."""
    metrics_port, healthz_port = free_port(), free_port()
    starter.start("kube-proxy", _kube_proxy_argv(cluster.bin_dir, metrics_port, healthz_port),
                  lambda: _answers_ok(f"http://127.0.0.1:{healthz_port}/healthz"),
                  "kube-proxy /healthz")  # fmt: skip
    health_port, ready_port = free_port(), free_port()
    corefile = _corefile(cluster.kubeconfig, health_port, ready_port)
    starter.start("coredns", [str(coredns), "-conf", str(corefile)],
                  lambda: _answers_ok(f"http://127.0.0.1:{ready_port}/ready"),
                  "CoreDNS ready")  # fmt: skip
    for name, port in cluster.health_ports.items():
        starter.ready(name, lambda port=port: _answers_ok(f"https://127.0.0.1:{port}/healthz"),
                      f"{name} /healthz")  # fmt: skip
    starter.ready("kube-controller-manager",
                  lambda: cluster.exists("serviceaccount", "default", "default"),
                  "the default service account")  # fmt: skip


def _make_cgroups() -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy (it must exist); a new cpuset starts with no
    CPUs and no memory nodes, so it gets its parent's."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not (hierarchy / "cgroup.procs").exists() or (hierarchy / "cgroup.controllers").exists():
            continue  # not a hierarchy, or the v2 one
        (hierarchy / CGROUP).mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists():
                (hierarchy / CGROUP / name).write_text((hierarchy / name).read_text())


def _make_bridge() -> None:
    """The bridge with the host's address, made before the API server binds that address; the CNI
    bridge plugin adopts it. Service ClusterIPs are routed to it from the host, with the bridge
    address as source so pods (which have no default route) can answer."""
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)


def _apiserver_argv(bin_dir: Path, etcd_port: int) -> list[str]:
    pki = BASE / "pki"
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--bind-address={NODE_IP}",
        f"--advertise-address={NODE_IP}",
        f"--secure-port={API_PORT}",
        f"--cert-dir={BASE / 'apiserver'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        # Otherwise it resolves the node's hostname through the machine's resolver.
        "--kubelet-preferred-address-types=InternalIP",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def _containerd_config() -> Path:
    """Debian's containerd with every path under BASE, the pause image of build_images.sh, and
    no OOM score below the daemon's own (this machine grants no CAP_SYS_RESOURCE)."""
    config = {
        "version": 2,
        "root": str(BASE / "containerd" / "root"),
        "state": str(BASE / "containerd" / "state"),
        "disabled_plugins": [
            f"io.containerd.snapshotter.v1.{name}" for name in ("aufs", "btrfs", "devmapper", "zfs")
        ],
        "grpc": {"address": str(BASE / "containerd.sock")},
        "ttrpc": {"address": str(BASE / "containerd.sock.ttrpc")},
        "plugins": {
            "io.containerd.internal.v1.opt": {"path": str(BASE / "containerd" / "opt")},
            "io.containerd.grpc.v1.cri": {
                "sandbox_image": PAUSE_IMAGE,
                "restrict_oom_score_adj": True,
                "disable_apparmor": True,
                "stream_server_address": "127.0.0.1",
                "stream_server_port": "0",
                "containerd": {
                    "snapshotter": "overlayfs",
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"SystemdCgroup": False, "Root": str(BASE / "runc")},
                        }
                    },
                },
                "cni": {"bin_dir": "/usr/lib/cni", "conf_dir": str(BASE / "cni")},
            },
        },
    }
    path = BASE / "containerd.toml"
    path.write_text(_toml(config))
    return path


def _toml(table: dict[str, Any], prefix: str = "") -> str:
    """Just enough TOML for the containerd config: scalars, lists of strings, nested tables."""
    scalars, tables = [], []
    for key, value in table.items():
        quoted = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
        if isinstance(value, dict):
            tables.append(_toml(value, f"{prefix}{quoted}."))
        else:
            scalars.append(f"{quoted} = {json.dumps(value)}")
    head = f"[{prefix[:-1]}]\n" if prefix and scalars else ""
    return head + "".join(f"{line}\n" for line in scalars) + "".join(tables)


def _write_cni_config() -> None:
    network = {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                # Services only: no default route, so a pod cannot reach beyond the machine.
                "routes": [{"dst": SERVICE_CIDR}],
                "dataDir": str(BASE / "cni-ipam"),
            },
        }],
    }  # fmt: skip
    (BASE / "cni").mkdir(exist_ok=True)
    (BASE / "cni" / "10-kubeserve-node.conflist").write_text(json.dumps(network, indent=2))


def _write_kubelet_config(ca: str) -> None:
    pki = BASE / "pki"
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this machine's controllers are bound to the v1 hierarchies
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP}",
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE to lower it
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{BASE / 'containerd.sock'}",
        "address": NODE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 0,
        "tlsCertFile": str(pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": ca},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [NODE_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "podLogsDir": str(BASE / "pod-logs"),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }
    (BASE / "kubelet.yaml").write_text(yaml.safe_dump(config))


def _kubelet_argv(bin_dir: Path) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={BASE / 'kubelet.yaml'}",
        f"--kubeconfig={BASE / 'kubelet.kubeconfig'}",
        f"--root-dir={BASE / 'kubelet'}",
        f"--cert-dir={BASE / 'kubelet-certs'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]


def _kube_proxy_argv(bin_dir: Path, metrics_port: int, healthz_port: int) -> list[str]:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(BASE / "kube-proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": POD_CIDR,
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Leave the machine's conntrack settings alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    path = BASE / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return [str(bin_dir / "kube-proxy"), f"--config={path}"]


def _corefile(kubeconfig: Path, health_port: int, ready_port: int) -> Path:
    """cluster.local and the reverse zones from the API; no forward plugin, so any other name is
    refused rather than looked up beyond the machine."""
    path = BASE / "Corefile"
    path.write_text(
        "cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {\n"
        f"    bind {NODE_IP}\n"
        "    errors\n"
        f"    health 127.0.0.1:{health_port}\n"
        f"    ready 127.0.0.1:{ready_port}\n"
        "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
        f"        kubeconfig {kubeconfig} kubeserve-test\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "    }\n"
        "    cache 30\n"
        "    loadbalance\n"
        "}\n"
    )
    return path


if __name__ == "__main__":  # `make k8s-node-clean`: what a crashed run left, without starting anew
    with node_lock(timeout_s=60):
        clean_node()
