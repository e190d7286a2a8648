"""Test support: a real Kubernetes control plane on 127.0.0.1 for the kubernetes test tier.

``start_control_plane()`` runs etcd, kube-apiserver (RBAC authorization, a static admin token in
``system:masters``), kube-controller-manager (every controller: Deployments, ReplicaSets,
DaemonSets, Jobs, garbage collection, EndpointSlices, service-account tokens, namespaces),
kube-scheduler, and the kubelet stand-in (``fake_kubelet.py``) that runs pods as local processes.
All of it lives in one temporary directory with free ports, and every process and file is removed
when the context exits. Binaries come from ``make k8s-binaries``; etcd from the system (Debian's
``etcd-server``) unless the binary directory holds one.

What tests get (``ControlPlane``): ``kubeconfig`` (admin), ``server``, ``kubectl(...)``,
``apply(...)``, ``get(...)``, ``api(...)`` for raw requests, ``env()`` for starting an operator
process, ``service_account_kubeconfig(...)`` to run something with a service account's RBAC,
``extra_node(...)`` for more nodes, and ``pod_log(...)`` because there is no kubelet API behind
``kubectl logs``.

What differs from a real cluster: pods are processes of the test virtualenv on 127.0.0.x (images
are ignored; containers need a ``command``), Service cluster IPs route nowhere (no kube-proxy: reach
pods through their EndpointSlices), and the API server is built to accept loopback addresses in
EndpointSlices (see ``build_k8s_binaries.sh``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.common import ROOT, free_port, wait_for
from support.fake_kubelet import die_with_parent, kubeconfig_text

HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "kubeserve" / "k8s"
NODE_NAME = "kubeserve-test-node"
SERVICE_CIDR = "10.96.0.0/16"
ADMIN_USER = "kubeserve-admin"
REQUIRED_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def find_bin_dir() -> Path | None:
    """``KUBESERVE_K8S_BIN`` if set (``make test`` sets it), else the newest cached build."""
    if os.environ.get("KUBESERVE_K8S_BIN"):
        return Path(os.environ["KUBESERVE_K8S_BIN"])
    stamps = sorted(CACHE.glob("v*/bin/.stamp"), key=lambda p: _version_key(p.parent.parent.name))
    return stamps[-1].parent if stamps else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def find_etcd(bin_dir: Path) -> str | None:
    local = bin_dir / "etcd"
    return str(local) if local.exists() else shutil.which("etcd")


class ProcessGroup:
    """Processes started for the control plane, stopped in reverse order of start."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=die_with_parent,  # no orphans even if pytest itself is killed
            )
        self.processes.append((name, process))

    def check(self, name: str) -> None:
        """Fail with the end of the log when ``name`` has exited."""
        for started, process in self.processes:
            if started == name and process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, name: str) -> None:
        """SIGTERM, then SIGKILL to the process group after 15 s."""
        for started, process in list(self.processes):
            if started != name:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            self.processes.remove((started, process))

    def stop_all(self) -> None:
        for name, _ in reversed(list(self.processes)):
            self.stop(name)


@dataclass
class ControlPlane:
    """A running control plane; see the module docstring for what it is made of."""

    bin_dir: Path
    work_dir: Path
    server: str
    kubeconfig: Path
    token: str
    ca_file: Path
    node_name: str = NODE_NAME
    processes: ProcessGroup | None = field(default=None, repr=False)
    _extra_nodes: int = field(default=0, repr=False)

    # -- kubectl ----------------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (as admin unless ``kubeconfig`` says otherwise); raise with its stderr when
        it fails and ``check``."""
        config = str(kubeconfig or self.kubeconfig)
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", config, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def apply(self, manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
        """``kubectl apply -f -`` of YAML text, one object, or a list of objects."""
        if not isinstance(manifest, str):
            documents = [manifest] if isinstance(manifest, Mapping) else list(manifest)
            manifest = yaml.safe_dump_all([dict(d) for d in documents])
        return self.kubectl("apply", "-f", "-", input=manifest).stdout

    def get(
        self,
        kind: str,
        name: str | None = None,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> Any:
        """``kubectl get -o json``: the object, or the list as a dict with ``items``."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        return json.loads(self.kubectl(*args).stdout)

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        return bool(self.kubectl(*args).stdout.strip())

    # -- raw API ----------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """One API request as admin (or ``token``); returns the decoded body, raises on >= 400."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {token or self.token}",
                "Content-Type": "application/json",
            },
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    # -- for processes under test -----------------------------------------------------------------
    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for a process that talks to this cluster (an operator, a CLI)."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        env["PATH"] = os.pathsep.join(
            [str(self.bin_dir), str(Path(sys.executable).parent), env["PATH"]]
        )
        return env

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig holding a token of service account ``namespace/name`` (created if missing),
        so a process run with it has exactly that account's RBAC."""
        if not self.exists("serviceaccount", name, namespace):
            self.kubectl("create", "serviceaccount", name, "-n", namespace)
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration=24h").stdout
        path = self.work_dir / "kubeconfigs" / f"{namespace}_{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(kubeconfig_text(self.server, str(self.ca_file), token.strip(), namespace))
        return path

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """What a pod's container wrote (the first container unless named)."""
        if container is None:
            container = self.get("pod", pod, namespace)["spec"]["containers"][0]["name"]
        path = self.work_dir / "kubelet" / "pods" / f"{namespace}_{pod}" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def component_log(self, name: str, lines: int = 60) -> str:
        """The end of a control-plane component's log (etcd, kube-apiserver, fake-kubelet...)."""
        assert self.processes is not None
        return self.processes.tail(name, lines)

    # -- nodes ------------------------------------------------------------------------------------
    def start_kubelet(
        self,
        node: str,
        pod_cidr: str,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
    ) -> None:
        """Start a kubelet stand-in for ``node``; its pods get addresses from ``pod_cidr``.

        Pods see this environment (the test virtualenv first on PATH, ``tests/apps`` and the
        package on PYTHONPATH): it plays the part of the container image.
        """
        assert self.processes is not None
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        env["PYTHONPATH"] = os.pathsep.join(
            [
                str(ROOT / "tests" / "apps"),
                str(ROOT / "benchmarks"),  # the benchmark's apps.py, as in the node's test image
                str(ROOT / "operator"),
                env.get("PYTHONPATH", ""),
            ]
        ).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        argv = [
            sys.executable,
            str(HERE / "fake_kubelet.py"),
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={node}",
            f"--work-dir={self.work_dir / 'kubelet'}",
            f"--pod-cidr={pod_cidr}",
        ]
        argv += [f"--label={k}={v}" for k, v in (labels or {}).items()]
        argv += [f"--capacity={k}={v}" for k, v in (capacity or {}).items()]
        self.processes.start(f"fake-kubelet-{node}", argv, env=env)

    def node_ready(self, node: str) -> bool:
        try:
            status = self.api("GET", f"/api/v1/nodes/{node}").get("status", {})
        except urllib.error.HTTPError:
            return False
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )

    @contextlib.contextmanager
    def extra_node(
        self,
        node: str,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
    ) -> Iterator[str]:
        """A second (third...) node for the duration of a ``with`` block, e.g. for DaemonSets or
        node selectors; its pods live on 127.<n>.0.x. On exit its pods and the Node are removed."""
        assert self.processes is not None
        self._extra_nodes += 1
        self.start_kubelet(node, f"127.{self._extra_nodes}.0.0/16", labels, capacity)
        try:
            wait_for(lambda: self.node_ready(node), 30, what=f"node {node} Ready")
            yield node
        finally:
            self.processes.stop(f"fake-kubelet-{node}")
            self.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
            self.kubectl(
                "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={node}",
                "--force", "--grace-period=0", "--ignore-not-found",
            )  # fmt: skip

    def create_namespace(self, prefix: str = "test") -> str:
        name = (
            f"{re.sub(r'[^a-z0-9-]', '-', prefix.lower())[:40].strip('-')}-{secrets.token_hex(3)}"
        )
        self.add_namespace(name)
        return name

    def add_namespace(self, name: str) -> None:
        """Create namespace ``name`` and wait for its default service account (pods need it)."""
        self.kubectl("create", "namespace", name)
        wait_for(
            lambda: self.exists("serviceaccount", "default", name),
            30,
            what=f"the default service account in {name}",
        )

    def delete_namespace(self, name: str) -> None:
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


# -- start-up -------------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path, extra_names: Sequence[str] = ()) -> None:
    """A CA, the API server's serving certificate (valid for ``extra_names`` too, e.g.
    ``IP:10.244.0.1``), and the service-account signing key."""
    pki.mkdir()
    _openssl("req", "-x509", *_EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
             "-subj", "/CN=kubeserve-test-ca", cwd=pki)  # fmt: skip
    names = ["IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes",
             "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
             "DNS:kubernetes.default.svc.cluster.local", *extra_names]  # fmt: skip
    sign_certificate(pki, "apiserver", "/CN=kube-apiserver", names)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def sign_certificate(pki: Path, name: str, subject: str, names: Sequence[str] = ()) -> None:
    """``name.key`` and ``name.crt`` in ``pki``, signed by its CA, for ``subject``
    (``/CN=.../O=...``) and the subject alternative ``names`` (``IP:...``, ``DNS:...``) if any."""
    _openssl("req", *_EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=pki)  # fmt: skip
    extensions = ["-extfile", f"{name}.ext"] if names else []
    if names:
        (pki / f"{name}.ext").write_text(f"subjectAltName={','.join(names)}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "7", *extensions, "-out", f"{name}.crt",
             cwd=pki)  # fmt: skip


def _etcd_argv(etcd: str, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    help_text = subprocess.run([etcd, "--help"], capture_output=True, text=True).stdout
    progress = "--experimental-watch-progress-notify-interval"
    if progress not in help_text and "--watch-progress-notify-interval" in help_text:
        progress = "--watch-progress-notify-interval"
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    argv = [
        etcd,
        "--name=kubeserve-test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kubeserve-test={peer}",
        # Without progress notifications, watches on idle resources fail on reconnect with
        # "Too large resource version".
        f"{progress}=200ms",
        "--log-level=warn",
    ]
    if "--logger" in help_text:
        argv.append("--logger=zap")  # etcd 3.4 defaults to the deprecated capnslog
    if "--unsafe-no-fsync" in help_text:
        argv.append("--unsafe-no-fsync")  # test data is thrown away
    return argv


def _answers_ok(url: str, token: str | None = None, ca_file: Path | None = None) -> bool:
    """Whether ``url`` answers 200 (TLS verified against ``ca_file`` when given)."""
    context = (
        ssl.create_default_context(cafile=str(ca_file))
        if ca_file
        else ssl._create_unverified_context()
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=2, context=context
        ) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def start_control_plane(bin_dir: Path, timeout_s: float = 120.0) -> Iterator[ControlPlane]:
    """Start everything, yield a ready ``ControlPlane`` (node Ready, default service account made),
    and tear it all down afterwards; ``KUBESERVE_K8S_KEEP=1`` keeps the work directory."""
    etcd = find_etcd(bin_dir)
    missing = [b for b in REQUIRED_BINARIES if not (bin_dir / b).exists()]
    if missing or etcd is None:
        raise RuntimeError(
            f"control-plane binaries missing ({', '.join(missing) or 'etcd'}) in {bin_dir}: "
            "run `make k8s-binaries`"
        )
    work = Path(tempfile.mkdtemp(prefix="kubeserve-k8s-"))
    processes = ProcessGroup(work)
    try:
        yield _start(bin_dir, etcd, work, processes, timeout_s)
    finally:
        processes.stop_all()
        if os.environ.get("KUBESERVE_K8S_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


def _start(
    bin_dir: Path, etcd: str, work: Path, processes: ProcessGroup, timeout_s: float
) -> ControlPlane:
    pki = work / "pki"
    make_pki(pki)
    token = secrets.token_hex(24)
    (pki / "tokens.csv").write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = work / "admin.kubeconfig"
    kubeconfig.write_text(kubeconfig_text(server, str(pki / "ca.crt"), token))
    plane = ControlPlane(
        bin_dir, work, server, kubeconfig, token, pki / "ca.crt", processes=processes
    )

    def ready(name: str, probe: Any, what: str) -> None:
        def check() -> bool:
            processes.check(name)
            return bool(probe())

        try:
            wait_for(check, timeout_s, interval_s=0.1, what=what)
        except AssertionError as err:
            raise RuntimeError(f"{err}\n{processes.tail(name)}") from None

    processes.start("etcd", _etcd_argv(etcd, work / "etcd", etcd_port, peer_port))
    ready("etcd", lambda: _answers_ok(f"http://127.0.0.1:{etcd_port}/health"), "etcd health")

    processes.start("kube-apiserver", [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={api_port}",
        f"--cert-dir={work / 'apiserver'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
    ])  # fmt: skip
    ready(
        "kube-apiserver",
        lambda: _answers_ok(f"{server}/readyz", token, pki / "ca.crt"),
        "kube-apiserver /readyz",
    )

    common = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    ]
    kcm_port, scheduler_port = free_port(), free_port()
    processes.start("kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"),
        *common,
        f"--secure-port={kcm_port}",
        f"--cert-dir={work / 'controller-manager'}",
        "--controllers=*",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--cluster-name=kubeserve-test",
    ])  # fmt: skip
    processes.start("kube-scheduler", [
        str(bin_dir / "kube-scheduler"),
        *common,
        f"--secure-port={scheduler_port}",
    ])  # fmt: skip
    plane.start_kubelet(NODE_NAME, "127.0.0.0/16")
    ready(
        "kube-controller-manager",
        lambda: _answers_ok(f"https://127.0.0.1:{kcm_port}/healthz"),
        "kube-controller-manager /healthz",
    )
    ready(
        "kube-scheduler",
        lambda: _answers_ok(f"https://127.0.0.1:{scheduler_port}/healthz"),
        "kube-scheduler /healthz",
    )
    ready(
        f"fake-kubelet-{NODE_NAME}", lambda: plane.node_ready(NODE_NAME), f"node {NODE_NAME} Ready"
    )
    ready(
        "kube-controller-manager",
        lambda: plane.exists("serviceaccount", "default", "default"),
        "the default service account (service-account controller running)",
    )
    return plane
