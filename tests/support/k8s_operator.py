"""Running kubeserve's operator against the test control plane, and the objects tests apply."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubeserve.runtime.kubernetes import contract
from support.common import free_port, http, wait_for
from support.k8s_control_plane import ControlPlane, die_with_parent
from support.node_cluster import NODE_IP

ROOT = Path(__file__).resolve().parents[2]


def install_crds(plane: ControlPlane) -> None:
    """Apply ``crds/`` and wait until both CRDs are Established (served by the API server)."""
    plane.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("serveinstances.kubeserve.io", "serveapplications.kubeserve.io"):
        wait_for(
            lambda crd=crd: (
                plane.kubectl(
                    "wait", "--for=condition=Established", f"crd/{crd}", "--timeout=5s", check=False
                ).returncode
                == 0
            ),
            60,
            what=f"{crd} Established",
        )


class OperatorProcess:
    """``kubeserve operator`` in ``namespace``, watching it and ``also_watch``; ``kubeconfig``
    defaults to the cluster's own (the operator benchmark passes one that goes through its
    request-counting proxy).

    Its admin server listens on loopback for the tests and on the node's bridge address for the
    pods, which report requests waiting for replicas there (``--report-url``), as they reach the
    chart's operator through its Service; ``host`` names another address for both (a cluster
    without the node's bridge: 127.0.0.1)."""

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        log_path: Path,
        *,
        kubeconfig: Path | None = None,
        also_watch: Sequence[str] = (),
        host: str = NODE_IP,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.plane, self.namespace, self.log_path = plane, namespace, log_path
        self.kubeconfig = kubeconfig
        self.watch = ",".join((namespace, *also_watch))
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.hosts = ",".join(dict.fromkeys(("127.0.0.1", host)))
        self.report_host = host
        self.extra_args = list(extra_args)

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubeserve.cli", "operator", "--namespace", self.namespace,
                 "--watch-namespaces", self.watch,
                 "--dashboard-host", self.hosts, "--dashboard-port", str(self.port),
                 "--report-url", f"http://{self.report_host}:{self.port}",
                 "--metrics-port", str(self.metrics_port), *self.extra_args],
                env=self.plane.env(self.kubeconfig), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=ROOT,
                preexec_fn=die_with_parent,  # no orphan operator, even if the caller is killed
            )  # fmt: skip
        wait_for(self._healthy, 60, interval_s=0.2, what="the operator's health endpoint")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited:\n{self.log()}")
        try:
            return http("GET", f"http://127.0.0.1:{self.port}/-/healthz", timeout=2)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def metric(self, name: str) -> float:
        """The value of the operator's unlabelled metric ``name``."""
        text = http("GET", f"http://127.0.0.1:{self.metrics_port}/metrics")[1]
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not in /metrics"
        return float(found.group(1))

    def rss_mib(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines() if line[:6] == "VmRSS:")
        return kib / 1024


#: The tests' pods run this image on the real node: the kubeserve image with ``tests/apps`` (and
#: the benchmark's ``apps.py``) in /app (``tests/kubernetes/node/build_images.sh``).
TESTS_IMAGE = "kubeserve-tests:0.1.0"
#: Deployment overrides for tests that run several replicas at once: a replica asks for one CPU
#: by default (Ray's ``num_cpus``), and the real node has two cores, shared with the proxy and with
#: the pods of the previous test's namespace while they terminate.
SMALL_REPLICA = {"rayActorOptions": {"numCpus": 0.1}}
#: The same override in Ray's config, for the admin API.
SMALL_RAY_REPLICA = {"ray_actor_options": {"num_cpus": 0.1}}
#: The project's own image, as the Dockerfile builds it.
KUBESERVE_IMAGE = "kubeserve:0.1.0"


def instance(namespace: str, port: int = 8000, image: str = TESTS_IMAGE) -> dict[str, Any]:
    """A ServeInstance with one proxy; its pods run ``image``, imported into the node (never
    pulled: there is no registry)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ServeInstance",
        "metadata": {"name": contract.DEFAULT_INSTANCE, "namespace": namespace},
        "spec": {
            "proxyLocation": "HeadOnly",
            "httpOptions": {"port": port},
            "image": image,
            "imagePullPolicy": "Never",
        },
    }


def application(namespace: str, name: str, import_path: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ServeApplication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"importPath": import_path, **spec},
    }


def ready_pods(plane: ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = plane.get("pods", namespace=namespace, selector=selector)["items"]
    return [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    ]


def ready_at_generation(app: dict[str, Any]) -> bool:
    """The ServeApplication ``app`` is Ready for its latest spec: its Ready condition is True
    and of the object's current generation."""
    return any(
        c["type"] == "Ready"
        and c["status"] == "True"
        and c.get("observedGeneration") == app["metadata"]["generation"]
        for c in (app.get("status") or {}).get("conditions", [])
    )


def wait_ready(plane: ControlPlane, operator: OperatorProcess, namespace: str, app: str) -> None:
    """``kubectl wait --for=condition=Ready`` on the application, with diagnostics on failure.
    Real pods (a build Job's, then the replicas') take a while, the more so on a busy
    machine."""
    result = plane.kubectl(
        "wait", "--for=condition=Ready", f"serveapplication/{app}", "-n", namespace,
        "--timeout=120s", check=False, timeout=130,
    )  # fmt: skip
    if result.returncode != 0:
        obj = plane.get("serveapplication", app, namespace)
        pods = plane.kubectl("get", "pods,jobs,deploy,cm", "-n", namespace, "-o", "wide").stdout
        status = obj.get("status")
        raise AssertionError(
            f"{app} not Ready: {result.stderr}\nstatus={status}\n{pods}\n{operator.log()}"
        )


def proxy_url(plane: ControlPlane, namespace: str, port: int = 8000) -> str:
    pods = wait_for(
        lambda: ready_pods(plane, namespace, "app.kubernetes.io/component=proxy"),
        60,
        what="a ready proxy pod",
    )
    return f"http://{pods[0]['status']['podIP']}:{port}"


def probe_answer(url: str) -> Any:
    """The JSON answer of ``tests/apps/e2e_probe.py`` at ``url``/probe; None while unreachable."""
    try:
        status, body = http("GET", f"{url}/probe")
    except OSError:
        return None
    return body if status == 200 else None


# -- on the real node ------------------------------------------------------------------------------
def hello(namespace: str) -> list[dict[str, Any]]:
    """``examples.hello`` at /hello, on an instance running the project's image (which ships it)."""
    return [
        instance(namespace, image=KUBESERVE_IMAGE),
        application(namespace, "hello", "examples.hello:app", routePrefix="/hello"),
    ]


def text_answer(url: str) -> str | None:
    """The body of a 200 answer at ``url``; None while unreachable or not 200."""
    try:
        status, body = http("GET", url)
    except OSError:
        return None
    return body if status == 200 else None


def proxy_service_url(plane: ControlPlane, namespace: str, path: str, port: int = 8000) -> str:
    """``path`` behind the instance's proxy Service (its ClusterIP), once it answers there."""
    cluster_ip = plane.get("service", "default-proxy", namespace)["spec"]["clusterIP"]
    url = f"http://{cluster_ip}:{port}{path}"
    wait_for(lambda: text_answer(url), 60, what=f"an answer at {url} through the proxy Service")
    return url


def serve_hello(plane: ControlPlane, operator: OperatorProcess, namespace: str) -> str:
    """Apply :func:`hello` in ``namespace``, wait until it is Ready and answers through the
    proxy Service; returns its URL there."""
    plane.apply(hello(namespace))
    wait_ready(plane, operator, namespace, "hello")
    return proxy_service_url(plane, namespace, "/hello")


class HealthSwitch:
    """Makes ``e2e_probe``'s replicas fail their health check (``KS_HEALTH_FILE`` exists) and pass
    again. The file is in the pod's scratch ``emptyDir`` (it survives a container restart),
    written with ``kubectl exec``."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.path = "/tmp/unhealthy"

    def set(self, unhealthy: bool, pod: str) -> None:
        command = ["touch", self.path] if unhealthy else ["rm", "-f", self.path]

        def done() -> bool:  # the container may be restarting (liveness)
            args = ["exec", pod, "-n", self.namespace, "--", *command]
            return self.plane.kubectl(*args, check=False).returncode == 0

        wait_for(done, 60, interval_s=1, what=f"{' '.join(command)} in {pod}")


class AdminApi:
    """The operator's admin API, called with ``token`` (the cluster admin's by default: the API
    authenticates every caller with a TokenReview)."""

    def __init__(self, operator: OperatorProcess, token: str | None = None) -> None:
        self.operator = operator
        self.url = f"http://127.0.0.1:{operator.port}"
        self.token = token or operator.plane.token

    def http(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        return http(method, url, body, headers={"Authorization": f"Bearer {self.token}"})

    def put(
        self, applications: list[dict[str, Any]], port: int = 8000, tests_image: bool = True
    ) -> tuple[int, Any]:
        if tests_image:
            self.use_tests_image()
        return self.http("PUT", f"{self.url}/api/serve/applications/", config(applications, port))

    def use_tests_image(self) -> None:
        """Pods of the serving layer a PUT starts run the tests' image (a PUT keeps the image of
        an existing ServeInstance; Ray's config has no field for it)."""
        plane, namespace = self.operator.plane, self.operator.namespace
        if not plane.exists("serveinstance", "default", namespace):
            plane.apply(instance(namespace))

    def details(self) -> dict[str, Any]:
        status, body = self.http("GET", f"{self.url}/api/serve/applications/")
        assert status == 200, body
        return dict(body)

    def wait_running(self, *apps: str, timeout_s: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            body = self.details()
            found = body["applications"]
            return body if all(found.get(a, {}).get("status") == "RUNNING" for a in apps) else None

        try:
            return wait_for(running, timeout_s, interval_s=0.2, what=f"{apps} RUNNING")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.details()}\n{self.operator.log()}") from None


def config(applications: list[dict[str, Any]], port: int = 8000) -> dict[str, Any]:
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "0.0.0.0", "port": port},
        "applications": applications,
    }


def grant(plane: ControlPlane, namespace: str, account: str, verbs: list[str], where: str) -> None:
    """A Role in ``where`` granting ``verbs`` on kubeserve's resources to the ServiceAccount
    ``namespace/account``."""
    rule = {
        "apiGroups": ["kubeserve.io"],
        "resources": ["serveinstances", "serveapplications"],
        "verbs": verbs,
    }
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": f"{namespace}-{account}", "namespace": where}
    plane.apply(
        [
            {"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": [rule]},
            {
                "apiVersion": rbac,
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": rbac.split("/")[0], "kind": "Role", "name": meta["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        ]
    )


def account_token(plane: ControlPlane, namespace: str, name: str, verbs: list[str]) -> str:
    """A token of a new ServiceAccount whose Role grants ``verbs`` on kubeserve's resources in its
    own namespace (none when ``verbs`` is empty)."""
    meta = {"name": name, "namespace": namespace}
    plane.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    if verbs:
        grant(plane, namespace, name, verbs, namespace)
    return plane.kubectl("create", "token", name, "-n", namespace).stdout.strip()


def raw_request(url: str, method: str = "GET", token: str | None = None) -> tuple[int, Any, str]:
    """(status, JSON body, WWW-Authenticate header) of one request."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null"), ""
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"null")
        return err.code, body, err.headers.get("WWW-Authenticate", "")
