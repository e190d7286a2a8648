"""Security of what the operator runs, on a real API server.

* the data-plane Secret: created by the operator, owned by the instance, reaching pods only by
  reference, never logged or shown in a status;
* kubelet probes reach the replica's unauthenticated probe listener, which reports the replica's
  own health checks, while the replica port itself answers nothing without the handshake;
* the NetworkPolicies are created and accepted (this cluster has no network plugin, so nothing
  enforces them: their rules are tested in ``tests/unit/kubernetes/test_render.py``);
* every object the operator renders passes a server-side dry run, its pods under the
  ``restricted`` Pod Security Standard enforced by the API server's admission.
"""

from __future__ import annotations

import base64
import json
import re
import socket
from typing import Any

from kubeserve.backends.kubernetes import render
from kubeserve.control import effective_config
from support.common import http, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    HealthSwitch,
    OperatorProcess,
    application,
    instance,
    probe_answer,
    proxy_url,
    ready_pods,
    wait_ready,
)

REPLICAS = "app.kubernetes.io/component=replica"


def owner_kinds(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(ref["kind"], ref["name"]) for ref in obj["metadata"].get("ownerReferences", [])}


def plain_http(host: str, port: int, path: str) -> bytes:
    """What a plain HTTP client gets (empty when cut off)."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        try:
            return sock.recv(4096)
        except ConnectionResetError:
            return b""


def pod_ready(plane: ControlPlane, namespace: str) -> bool | None:
    pods = plane.get("pods", namespace=namespace, selector=REPLICAS)["items"]
    if len(pods) != 1:
        return None
    conditions = pods[0]["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_secret_probes_and_network_policies(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    health = HealthSwitch(plane, namespace)
    spec = {
        "routePrefix": "/probe",
        "runtimeEnv": {"envVars": {"KS_HEALTH_FILE": health.path}},
    }
    plane.apply([instance(namespace), application(namespace, "probe", "e2e_probe:app", **spec)])
    wait_ready(plane, operator, namespace, "probe")
    url = proxy_url(plane, namespace)
    assert wait_for(lambda: probe_answer(url), 60, what="traffic through the proxy")["pid"]

    # The Secret: one per instance, owned by it, 32 random bytes in hex.
    owner = plane.get("serveinstance", "default", namespace)
    secret = plane.get("secret", "default-dataplane-secret", namespace)
    assert owner_kinds(secret) == {("ServeInstance", "default")}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert secret["immutable"] is True
    value = base64.b64decode(secret["data"]["secret"]).decode()
    assert re.fullmatch(r"[0-9a-f]{64}", value)
    # ... reaching pods only by reference, and never written anywhere else.
    pods = plane.get("pods", namespace=namespace)["items"]
    for pod in pods:
        assert value not in json.dumps(pod)
    for pod in pods:
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") in ("replica", "proxy"):
            [container] = pod["spec"]["containers"]
            ref = {"name": "default-dataplane-secret", "key": "secret"}
            assert {
                "name": "KUBESERVE_DATA_PLANE_SECRET",
                "valueFrom": {"secretKeyRef": ref},
            } in container["env"]
    statuses = [plane.get("serveinstance", "default", namespace)["status"]]
    statuses.append(plane.get("serveapplication", "probe", namespace)["status"])
    assert value not in json.dumps(statuses)
    assert value not in operator.log_path.read_text(errors="replace")

    # NetworkPolicies: created, owned by the instance, accepted by the API server.
    policies = plane.get("networkpolicies", namespace=namespace)["items"]
    assert {p["metadata"]["name"] for p in policies} == {
        "default-replicas",
        "default-proxies",
        "default-autoscaling-policies",
    }
    assert all(owner_kinds(p) == {("ServeInstance", "default")} for p in policies)

    # The replica port answers nothing without the handshake; the probe port only GET /-/healthz.
    [replica] = ready_pods(plane, namespace, REPLICAS)
    ip = replica["status"]["podIP"]
    assert not plain_http(ip, 8000, "/-/healthz").startswith(b"HTTP/")
    assert http("GET", f"http://{ip}:8081/-/healthz") == (200, "ok")
    assert http("GET", f"http://{ip}:8081/-/reconfigure")[0] == 404
    assert http("GET", f"http://{ip}:8081/probe")[0] == 404

    # The kubelet sees the replica's own check_health: failing takes the pod out of rotation...
    health.set(True, replica["metadata"]["name"])
    wait_for(lambda: pod_ready(plane, namespace) is False, 60, what="the replica NotReady")
    # ... and passing again brings it back.
    health.set(False, replica["metadata"]["name"])
    wait_for(lambda: pod_ready(plane, namespace), 90, what="the replica Ready again")


def test_rendered_objects_pass_a_server_side_dry_run_under_restricted_pod_security(
    control_plane: ControlPlane, namespace: str
) -> None:
    plane = control_plane
    plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    meta = {
        "name": "default",
        "namespace": namespace,
        "uid": "6f0e5d2c-0000-4000-8000-000000000001",
    }
    inst = render.instance_view({"metadata": meta, "spec": {"proxyLocation": "HeadOnly"}})
    runtime_env = {"working_dir": "https://example.com/app.zip", "env_vars": {"A": "1"}}
    config = {"name": "shop", "import_path": "shop.main:app", "runtime_env": runtime_env}
    app_meta = {**meta, "name": "shop", "uid": "6f0e5d2c-0000-4000-8000-000000000002"}
    app = render.app_view({"metadata": {**app_meta, "generation": 1}}, config)
    effective = effective_config.effective_deployment("Model", {}, None)
    deployment = render.deployment_view(config, effective)
    objects = [
        render.render_data_plane_secret(inst, "ab" * 32),
        *render.render_dataplane_rbac(inst),
        *render.render_instance_network_policies(inst, "kubeserve-system"),
        *render.render_proxy(inst),
        render.render_replica_workload(inst, app, deployment),
        render.render_replica_service(inst, app, deployment),
        render.render_build_job(inst, app),
        render.render_policy_workload(inst, app),
    ]
    # Pods as the controllers would create them from each template: admission enforces the
    # restricted profile on pods (on workloads it only warns).
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"pod-{i}", "namespace": namespace},
            "spec": obj["spec"]["template"]["spec"],
        }
        for i, obj in enumerate(objects)
        if "template" in obj.get("spec", {})
    ]
    assert len(pods) == 4  # proxy, replica, build, policy host
    # A pod's ServiceAccount must exist (without the owner, which exists in no cluster here).
    for account in (o for o in objects if o["kind"] == "ServiceAccount"):
        meta = {k: v for k, v in account["metadata"].items() if k != "ownerReferences"}
        plane.apply({**account, "metadata": meta})
    items = objects + pods
    result = plane.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(items)
    assert "violate" not in result.stderr  # no PodSecurity warning for the workloads either

    # Guard: the same admission refuses a pod that breaks the profile.
    bad = json.loads(json.dumps(pods[0]))
    bad["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(bad), check=False
    )
    assert refused.returncode != 0 and "allowPrivilegeEscalation" in refused.stderr
