"""The parts of a test Kubernetes control plane that the real node cluster builds on.

:class:`ControlPlane` is what tests get: ``kubeconfig`` (admin), ``server``, ``kubectl(...)``,
``apply(...)``, ``get(...)``, ``api(...)`` for raw requests, ``env()`` for starting an operator
process, ``service_account_kubeconfig(...)`` to run something with a service account's RBAC,
namespaces per test. :mod:`support.node_cluster` starts one on a real node (etcd, the unpatched
control plane, kubelet, containerd, kube-proxy, CoreDNS) with the helpers here: the process group
of its daemons, the PKI, etcd's command line.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.common import wait_for

CACHE = Path.home() / ".cache" / "kubeserve" / "k8s"
SERVICE_CIDR = "10.96.0.0/16"
ADMIN_USER = "kubeserve-admin"


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
        #: name -> how it was last started, for :meth:`restart`
        self.commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.commands[name] = (list(argv), dict(env) if env is not None else None)
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

    def start_again(self, name: str) -> None:
        """Start ``name`` (stopped) as it was last started."""
        argv, env = self.commands[name]
        self.start(name, argv, env)

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
    node_name: str = ""
    processes: ProcessGroup | None = field(default=None, repr=False)

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
    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> Any:
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
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
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

    def component_log(self, name: str, lines: int = 60) -> str:
        """The end of a control-plane component's log (etcd, kube-apiserver, kubelet...)."""
        assert self.processes is not None
        return self.processes.tail(name, lines)

    def node_ready(self, node: str) -> bool:
        try:
            status = self.api("GET", f"/api/v1/nodes/{node}").get("status", {})
        except urllib.error.HTTPError:
            return False
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )

    def create_namespace(self, prefix: str = "test", timeout_s: float = 60) -> str:
        name = (
            f"{re.sub(r'[^a-z0-9-]', '-', prefix.lower())[:40].strip('-')}-{secrets.token_hex(3)}"
        )
        self.add_namespace(name, timeout_s)
        return name

    def add_namespace(self, name: str, timeout_s: float = 60) -> None:
        """Create namespace ``name`` and wait for its default service account (pods need it; the
        controller-manager creates it). Past ``timeout_s`` the failure carries the end of the
        controller-manager's log, where a lagging or failing controller shows."""
        self.kubectl("create", "namespace", name)
        try:
            wait_for(
                lambda: self.exists("serviceaccount", "default", name),
                timeout_s,
                what=f"the default service account in {name}",
            )
        except AssertionError as exc:
            log = self.component_log("kube-controller-manager", 40) if self.processes else ""
            raise AssertionError(f"{exc}\nkube-controller-manager's log ends:\n{log}") from None

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


def die_with_parent() -> None:
    """Runs in a child before exec: it must not outlive the test process that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kubeconfig_text(server: str, ca_file: str, token: str, namespace: str = "default") -> str:
    """A kubeconfig for ``server`` authenticating with ``token``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeserve-test",
                "cluster": {"server": server, "certificate-authority": ca_file},
            }
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kubeserve-test",
                "context": {"cluster": "kubeserve-test", "user": "user", "namespace": namespace},
            }
        ],
        "current-context": "kubeserve-test",
    }
    return yaml.safe_dump(config)
