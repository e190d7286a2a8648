"""``serve.run`` against the operator's admin API: a driver script's application object, pickled
and PUT with the caller's Kubernetes token, stored in a Secret owned by its ``ServeApplication``,
built and served by pods of the real node that mount it (they cannot import the script), beside
an application deployed by config, which never notices.

Needs the node (``KUBESERVE_K8S_NODE=1``, images from ``make node-images``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubeserve.backends.kubernetes.backend import MAX_STORED_GRAPH_BYTES
from support.common import ROOT, http, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    SMALL_RAY_REPLICA,
    AdminApi,
    OperatorProcess,
    account_token,
    proxy_service_url,
    proxy_url,
)

#: Ray's quickstart as a driver script, its replicas asking for 0.25 CPU (the node has 2)
QUICKSTART = ROOT / "benchmarks" / "quickstart_driver.py"
PROBE = {
    "name": "probe",
    "route_prefix": "/probe",
    "import_path": "e2e_probe:app",
    "deployments": [{"name": "Probe", "user_config": {"greeting": "hi"}, **SMALL_RAY_REPLICA}],
}
IMPERATIVE_PATH = "/api/kubeserve/applications/{name}"


def run_driver(api: AdminApi, script: Path, proxy: str, cwd: Path) -> Any:
    """``script`` run as a user runs it against the cluster (its own folder not
    importable by the pods); its last JSON line."""
    environment = dict(os.environ)
    environment.pop("PYTHONPATH", None)
    environment.update(
        KUBESERVE_ADDRESS=api.url,
        KUBESERVE_AUTH_TOKEN=api.token,
        KUBESERVE_STATE_DIR=str(cwd),  # no data-plane secret here: handles stay in the cluster
        PROXY_URL=proxy,
        PYTHONPATH=str(ROOT / "operator"),
    )
    result = subprocess.run(
        [sys.executable, "-m", "kubeserve.compat", str(script)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise AssertionError(result.stdout + result.stderr + cluster_state(api))
    return json.loads(result.stdout.strip().splitlines()[-1])


def cluster_state(api: AdminApi) -> str:
    """What the operator reports and the namespace holds, with the build pods' logs."""
    plane, namespace = api.operator.plane, api.operator.namespace
    objects = plane.kubectl(
        "get", "pods,jobs,secrets,configmaps,events", "-n", namespace, "-o", "wide", check=False
    )
    builds = plane.kubectl(
        "logs", "-n", namespace, "-l", "app.kubernetes.io/component=build", "--tail=40",
        check=False,
    )  # fmt: skip
    return "\n".join(
        [json.dumps(api.details(), indent=1)[-3000:], objects.stdout, builds.stdout + builds.stderr]
    )


def graph_secrets(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=pickled-graph"
    return list(plane.get("secrets", namespace=namespace, selector=selector)["items"])


def pod_uids(plane: ControlPlane, namespace: str, app: str) -> set[str]:
    pods = plane.get("pods", namespace=namespace, selector=f"kubeserve.io/application={app}")
    return {p["metadata"]["uid"] for p in pods["items"] if p["status"].get("phase") == "Running"}


def raw_put(url: str, body: dict[str, Any], token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http("PUT", url, body, headers=headers)


def test_serve_run_from_a_driver_reaches_running_beside_a_config_deploy(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    plane, api = control_plane, AdminApi(operator)
    status, body = api.put([PROBE])
    assert status == 200, body
    api.wait_running("probe")
    proxy = proxy_url(plane, namespace)
    probe_pods = pod_uids(plane, namespace, "probe")
    assert probe_pods
    put_url = api.url + IMPERATIVE_PATH.format(name="quickstart")

    # Without a token: 401, and nothing is written.
    status, body = raw_put(put_url, {"graph": base64.b64encode(b"x").decode()}, None)
    assert status == 401, body
    # A graph larger than a Secret holds: 413 naming the limit, before anything changes.
    too_large = base64.b64encode(os.urandom(MAX_STORED_GRAPH_BYTES + 1)).decode()
    status, body = raw_put(put_url, {"route_prefix": "/quickstart", "graph": too_large}, api.token)
    assert status == 413, body
    assert str(MAX_STORED_GRAPH_BYTES) in body["error"] and "Secret" in body["error"]
    assert set(api.details()["applications"]) == {"probe"}
    assert not graph_secrets(plane, namespace)

    # The driver's serve.run: RUNNING, then answering through the proxy pod.
    assert run_driver(api, QUICKSTART, proxy, tmp_path) == {"sum": 5}
    apps = api.details()["applications"]
    assert apps["quickstart"]["status"] == "RUNNING"
    assert apps["quickstart"]["source"] == "imperative"
    assert apps["quickstart"].get("deployed_app_config") is None
    assert apps["probe"]["source"] == "declarative"
    spec = plane.get("serveapplication", "quickstart", namespace)["spec"]
    assert set(spec) == {"appName", "instance", "routePrefix", "pickledGraph"}
    (secret,) = graph_secrets(plane, namespace)
    assert secret["immutable"] is True
    assert [o["name"] for o in secret["metadata"]["ownerReferences"]] == ["quickstart"]
    status, imperative = api.http("GET", f"{api.url}/api/serve/applications/?api_type=imperative")
    assert status == 200 and set(imperative["applications"]) == {"quickstart"}, imperative

    # A config PUT that does not list it keeps it (as in Ray 2.60) ...
    status, body = api.put([PROBE])
    assert status == 200, body
    assert set(api.details()["applications"]) == {"probe", "quickstart"}
    assert http("GET", f"{proxy}/quickstart?x=4") == (200, {"sum": 6})
    service = proxy_service_url(plane, namespace, "/quickstart?x=1")  # the Service users reach
    assert http("GET", service) == (200, {"sum": 3})
    # ... and may not take its route (409, nothing changed).
    taker = {**PROBE, "name": "taker", "route_prefix": "/quickstart"}
    status, body = api.put([PROBE, taker])
    assert status == 409, body
    assert 'Prefix /quickstart is being used by application "quickstart"' in body["error"]
    assert set(api.details()["applications"]) == {"probe", "quickstart"}
    assert pod_uids(plane, namespace, "probe") == probe_pods  # the config's app never noticed

    # serve.delete's DELETE removes it, its pods and its Secret.
    status, body = api.http("DELETE", put_url)
    assert status == 200, body
    wait_for(lambda: "quickstart" not in api.details()["applications"], 60, what="it gone")
    wait_for(lambda: not graph_secrets(plane, namespace), 60, what="its Secret collected")
    assert http("GET", f"{proxy}/probe")[0] == 200
    assert pod_uids(plane, namespace, "probe") == probe_pods


def test_imperative_writes_need_the_callers_rbac_rights(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    viewer = account_token(plane, namespace, "viewer", ["get", "list"])
    url = f"http://127.0.0.1:{operator.port}" + IMPERATIVE_PATH.format(name="app")
    body = {"graph": base64.b64encode(b"not a graph").decode()}
    status, answer = raw_put(url, body, viewer)
    assert status == 403, answer
    assert "create serveapplications.kubeserve.io" in answer["error"]
    assert http("DELETE", url, headers={"Authorization": f"Bearer {viewer}"})[0] == 403
    assert not plane.get("serveapplications", namespace=namespace)["items"]
    assert not plane.exists("serveinstance", "default", namespace)
