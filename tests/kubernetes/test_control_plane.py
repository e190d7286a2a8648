"""The test control plane behaves like a cluster: what the operator tests rely on.

Deployments become Ready pods that answer on their own addresses, Services get EndpointSlices,
deleting an owner garbage-collects its pods and their processes, Jobs complete, restart policies
and grace periods are honoured, and RBAC is enforced.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from support.common import http, pid_alive, wait_for
from support.k8s_control_plane import ControlPlane


@pytest.fixture(scope="module")
def control_plane(stand_in: ControlPlane) -> ControlPlane:
    """These tests are about the stand-in itself, whatever the tier's other tests run on."""
    return stand_in


SERVER = """
import http.server, json, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"name": os.environ["POD_NAME"], "ip": os.environ["POD_IP"],
                           "namespace": os.environ["POD_NAMESPACE"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((os.environ["KUBESERVE_POD_IP"], 8080), Handler).serve_forever()
"""


def web_manifests(namespace: str, replicas: int = 2) -> list[dict[str, Any]]:
    labels = {"app": "web"}
    downward = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_IP", "status.podIP"),
        ]
    ]
    container = {
        "name": "web",
        "image": "kubeserve:test",
        "command": ["python", "-c", SERVER],
        "env": downward,
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 8080}]},
    }
    return [deployment, service]


def pods(plane: ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(plane.get("pods", namespace=namespace, selector=selector)["items"])


def container_pid(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["containerID"].split("://")[1])


def test_deployment_pods_are_ready_reachable_and_garbage_collected(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.apply(web_manifests(namespace))
    control_plane.kubectl(
        "wait", "deployment/web", "--for=condition=Available", "-n", namespace, "--timeout=60s"
    )
    running = wait_for(
        lambda: [p for p in pods(control_plane, namespace, "app=web") if p["status"].get("podIP")],
        30,
        what="2 pods with addresses",
    )
    assert len(running) == 2
    ips = {p["status"]["podIP"] for p in running}
    assert len(ips) == 2 and all(ip.startswith("127.0.") for ip in ips)

    for pod in running:
        status, body = http("GET", f"http://{pod['status']['podIP']}:8080/")
        assert status == 200
        assert body == {
            "name": pod["metadata"]["name"],
            "ip": pod["status"]["podIP"],
            "namespace": namespace,
        }

    def sliced_ips() -> set[str] | None:
        slices = control_plane.get(
            "endpointslices", namespace=namespace, selector="kubernetes.io/service-name=web"
        )["items"]
        ready = {
            address
            for s in slices
            for endpoint in s.get("endpoints") or []
            if endpoint.get("conditions", {}).get("ready")
            for address in endpoint["addresses"]
        }
        return ready if ready == ips else None

    wait_for(sliced_ips, 30, what=f"EndpointSlices of Service web to list {ips}")

    pids = [container_pid(p) for p in running]
    assert all(pid_alive(pid) for pid in pids)
    control_plane.kubectl("delete", "deployment", "web", "-n", namespace)
    wait_for(
        lambda: not pods(control_plane, namespace, "app=web"), 60, what="pods garbage-collected"
    )
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 10, what="pod processes to exit")


def test_job_runs_init_containers_then_completes(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.apply(
        f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: build
  namespace: {namespace}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      initContainers:
        - name: fetch
          image: kubeserve:test
          command: ["python", "-c", "open('fetched', 'w').write('42')"]
      containers:
        - name: build
          image: kubeserve:test
          command: ["python", "-c"]
          args: ["import sys; print('built', open('fetched').read(), sys.argv[1:])", "$(MODE)"]
          env:
            - name: MODE
              value: release
"""
    )
    control_plane.kubectl(
        "wait", "job/build", "--for=condition=Complete", "-n", namespace, "--timeout=60s"
    )
    [pod] = pods(control_plane, namespace, "batch.kubernetes.io/job-name=build")
    assert pod["status"]["phase"] == "Succeeded"
    [init] = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert "built 42 ['release']" in control_plane.pod_log(namespace, pod["metadata"]["name"])


def test_crashing_container_is_restarted(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl(
        "run", "crash", "-n", namespace, "--image=kubeserve:test", "--restart=Always",
        "--command", "--", "python", "-c", "raise SystemExit(3)",
    )  # fmt: skip

    def restarted() -> dict[str, Any] | None:
        statuses = control_plane.get("pod", "crash", namespace)["status"].get(
            "containerStatuses", []
        )
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_for(restarted, 30, what="restartCount >= 2")
    assert status["lastState"]["terminated"]["exitCode"] == 3


def test_deletion_honours_the_grace_period(control_plane: ControlPlane, namespace: str) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stubborn", "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 2,
                "containers": [
                    {"name": "main", "image": "x", "command": ["python", "-c", stubborn]}
                ],
            },
        }
    )
    control_plane.kubectl(
        "wait", "pod/stubborn", "--for=condition=Ready", "-n", namespace, "--timeout=30s"
    )
    pid = container_pid(control_plane.get("pod", "stubborn", namespace))
    started = time.monotonic()
    control_plane.kubectl("delete", "pod", "stubborn", "-n", namespace, "--timeout=30s")
    elapsed = time.monotonic() - started
    assert 2 <= elapsed < 15, elapsed
    assert not pid_alive(pid)


def test_rbac_is_enforced(control_plane: ControlPlane, namespace: str) -> None:
    account = f"system:serviceaccount:{namespace}:default"
    can_i = control_plane.kubectl(
        "auth", "can-i", "list", "pods", "-n", namespace, f"--as={account}", check=False
    )
    assert can_i.stdout.strip() == "no"
    kubeconfig = control_plane.service_account_kubeconfig(namespace, "reader")
    control_plane.kubectl(
        "create", "rolebinding", "reader", "-n", namespace, "--clusterrole=view",
        f"--serviceaccount={namespace}:reader",
    )  # fmt: skip
    result = control_plane.kubectl(
        "get", "pods", "-n", namespace, check=False, kubeconfig=kubeconfig
    )
    assert result.returncode == 0, result.stderr
    denied = control_plane.kubectl(
        "get", "secrets", "-n", namespace, check=False, kubeconfig=kubeconfig
    )
    assert "forbidden" in denied.stderr


def test_daemonset_runs_one_ready_pod_per_node(control_plane: ControlPlane, namespace: str) -> None:
    deployment, _ = web_manifests(namespace)
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "selector": deployment["spec"]["selector"],
            "template": deployment["spec"]["template"],
        },
    }
    with control_plane.extra_node("kubeserve-test-node-2", labels={"example.com/gpu": "a100"}):
        control_plane.apply(daemonset)
        control_plane.kubectl(
            "rollout", "status", "daemonset/web", "-n", namespace, "--timeout=60s"
        )
        placed = {
            p["spec"]["nodeName"]: p["status"]["podIP"]
            for p in pods(control_plane, namespace, "app=web")
        }
        assert placed.keys() == {control_plane.node_name, "kubeserve-test-node-2"}
        assert placed["kubeserve-test-node-2"].startswith("127.1.0.")
        for ip in placed.values():
            assert http("GET", f"http://{ip}:8080/")[0] == 200
    wait_for(
        lambda: len(pods(control_plane, namespace, "app=web")) == 1,
        30,
        what="the removed node's pod to go",
    )
