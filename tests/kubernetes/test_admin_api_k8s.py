"""The admin API served by the operator: Ray's REST families over custom resources and pods.

Everything is real: the node cluster, the operator process (its admin API on the dashboard
port), pods in containerd, HTTP through the proxy pod, and Ray 2.60's ``serve`` client. The local
backend answers the same config with the same shape of body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from kubeserve.schema.status import ServeInstanceDetails
from support import ray_cli
from support.common import http, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    SMALL_RAY_REPLICA,
    SMALL_REPLICA,
    AdminApi,
    OperatorProcess,
    account_token,
    config,
    instance,
    proxy_url,
    raw_request,
)
from support.kubeserve_start import Kubeserve
from support.ray_cli import needs_ray_serve

RAY_REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "ray-2.60"
EMPTY = {"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None}

PROBE = {
    "name": "probe",
    "route_prefix": "/probe",
    "import_path": "e2e_probe:app",
    "deployments": [{"name": "Probe", "user_config": {"greeting": "hi"}, **SMALL_RAY_REPLICA}],
}
#: a Ray name that is no Kubernetes object name
SECOND = {
    "name": "Second App",
    "route_prefix": "/second",
    "import_path": "e2e_probe:app",
    "deployments": [{"name": "Probe", **SMALL_RAY_REPLICA}],
}


def answer(url: str) -> Any:
    try:
        status, body = http("GET", url, timeout=5)
    except OSError:
        return None
    return body if status == 200 else None


def cr_names(plane: ControlPlane, namespace: str) -> set[str]:
    out = plane.kubectl("get", "serveapplications", "-n", namespace, "-o", "name").stdout
    return {line.split("/", 1)[1] for line in out.split()}


def remaining(plane: ControlPlane, namespace: str) -> str:
    """What is left of the serving layer in ``namespace`` (empty when all is gone)."""
    owned = plane.kubectl(
        "get", "deployments,services,jobs,configmaps,pods", "-n", namespace,
        "-l", "app.kubernetes.io/managed-by=kubeserve", "-o", "name",
    ).stdout  # fmt: skip
    crs = plane.kubectl(
        "get", "serveinstances,serveapplications", "-n", namespace, "-o", "name"
    ).stdout
    return (owned + crs).strip()


def shape(value: Any) -> Any:
    """The keys of a details body, recursively; maps keyed by names become one sample entry."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None


def details_shape(body: dict[str, Any]) -> Any:
    """``shape`` with named maps (applications, deployments, proxies, nodes) reduced to a key set
    common to all entries, so bodies of different clusters compare."""
    body = json.loads(json.dumps(body))
    body["proxies"] = {"*": next(iter(body["proxies"].values()))}
    for app in body["applications"].values():
        app["deployments"] = {"*": next(iter(app["deployments"].values()))}
        app["deployment_topology"]["nodes"] = {
            "*": next(iter(app["deployment_topology"]["nodes"].values()))
        }
    body["applications"] = {"*": body["applications"]["probe"]}
    return shape(body)


def test_put_get_traffic_prune_conflict_delete(
    control_plane: ControlPlane,
    operator: OperatorProcess,
    namespace: str,
    clean_kubeserve: Kubeserve,
) -> None:
    plane, api = control_plane, AdminApi(operator)
    assert api.details() == EMPTY
    status, body = api.put([PROBE, SECOND])
    assert status == 200, body

    serve_instance = plane.get("serveinstance", "default", namespace)
    assert serve_instance["spec"]["httpOptions"]["port"] == 8000
    assert serve_instance["spec"]["proxyLocation"] == "HeadOnly"
    probe = plane.get("serveapplication", "probe", namespace)
    assert probe["spec"] == {  # exactly the config sent: unset fields absent
        "appName": "probe",
        "instance": "default",
        "routePrefix": "/probe",
        "importPath": "e2e_probe:app",
        "deployments": [
            {"name": "Probe", "userConfig": {"greeting": "hi"}, **SMALL_REPLICA},
        ],
    }
    (second,) = cr_names(plane, namespace) - {"probe"}
    assert second.startswith("second-app-")
    assert plane.get("serveapplication", second, namespace)["spec"]["appName"] == "Second App"
    accepted = api.details()["applications"]  # a GET right after the PUT shows the new config
    assert accepted["probe"]["deployed_app_config"] == PROBE

    body = api.wait_running("probe", "Second App")
    jsonschema.validate(body, json.loads((RAY_REFERENCE / "ServeInstanceDetails.json").read_text()))
    parsed = ServeInstanceDetails.model_validate(body)
    app = parsed.applications["probe"]
    assert body["applications"]["probe"]["deployed_app_config"] == PROBE
    assert app.route_prefix == "/probe"
    dep = app.deployments["Probe"]
    assert dep.deployment_config.user_config == {"greeting": "hi"}  # type: ignore[union-attr]
    assert (
        body["applications"]["probe"]["deployments"]["Probe"]["deployment_config"][
            "health_check_period_s"
        ]
        == 0.2
    )  # from the code, through the build graph
    assert dep.target_num_replicas == 1
    pods = plane.get("pods", namespace=namespace, selector="kubeserve.io/application=probe")
    assert dep.replicas
    assert {r.replica_id for r in dep.replicas} <= {p["metadata"]["name"] for p in pods["items"]}
    assert all(r.node_id == control_plane.node_name and r.start_time_s for r in dep.replicas)
    assert body["controller_info"]["node_id"]

    url = proxy_url(plane, namespace)

    def configured() -> Any:
        reply = answer(f"{url}/probe")
        return reply if reply and reply["config"] == {"greeting": "hi"} else None

    try:
        wait_for(configured, 60, what="an answer with the user_config through the proxy pod")
    except AssertionError as err:
        pods = plane.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout
        raise AssertionError(f"{err}\n{url}: {answer(f'{url}/probe')}\n{pods}") from None
    assert wait_for(lambda: answer(f"{url}/second"), 60, what="the second application")

    # The same config on the local backend answers with a body of the same shape.
    local = clean_kubeserve
    assert local.put([PROBE, SECOND])[0] == 200
    local.wait_app("probe")
    local.wait_app("Second App")
    local.wait_proxy()
    assert details_shape(api.details()) == details_shape(local.details())

    # A PUT without an application deletes its custom resource (and so its pods).
    status, body = api.put([PROBE])
    assert status == 200, (body, operator.log())
    assert cr_names(plane, namespace) <= {"probe", second}
    wait_for(lambda: cr_names(plane, namespace) == {"probe"}, 60, what="the second CR deleted")
    wait_for(lambda: "Second App" not in api.details()["applications"], 30, what="second app gone")
    assert answer(f"{url}/probe")["config"] == {"greeting": "hi"}

    # host and port are fixed while the serving layer runs.
    status, body = api.put([PROBE], port=8001)
    assert status == 409
    assert "port" in body["error"] and "DELETE" in body["error"]
    assert plane.get("serveinstance", "default", namespace)["spec"]["httpOptions"]["port"] == 8000

    # DELETE removes the instance, and garbage collection everything it owns.
    assert api.http("DELETE", f"{api.url}/api/serve/applications/")[0] == 200
    wait_for(lambda: remaining(plane, namespace) == "", 90, interval_s=0.5, what="all gone")
    wait_for(lambda: api.details() == EMPTY, 30, what="an empty GET")
    assert api.http("DELETE", f"{api.url}/api/serve/applications/")[0] == 200  # no-op


def test_single_application_family(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane, api = control_plane, AdminApi(operator)
    base = f"{api.url}/api/serve/deployments/"
    body = {"import_path": "e2e_probe:app", "route_prefix": "/probe", "port": 8000}
    serving = instance(namespace)  # with the fields Ray's config has not, which a PUT keeps
    serving["spec"]["proxy"] = {"dataPath": "python"}
    plane.apply(serving)
    given = plane.get("serveinstance", "default", namespace)["spec"]  # with the CRD's defaults
    assert given["proxy"]["dataPath"] == "python"
    put = api.http("PUT", base, body)
    assert put[0] == 200, (put, operator.log())
    assert api.http("GET", base) == (200, body)
    spec = plane.get("serveinstance", "default", namespace)["spec"]
    assert (spec["image"], spec["proxy"]) == (serving["spec"]["image"], given["proxy"])

    def running() -> dict[str, Any] | None:
        status = api.http("GET", f"{base}status")[1]
        return status if status["app_status"]["status"] == "RUNNING" else None

    try:
        status = wait_for(running, 90, what="the single application RUNNING")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{api.details()}\n{operator.log()}") from None
    assert status["name"] == ""
    assert status["deployment_statuses"] == [{"name": "Probe", "status": "HEALTHY", "message": ""}]
    assert status["app_status"]["deployment_timestamp"] > 0
    url = proxy_url(plane, namespace)
    assert wait_for(lambda: answer(f"{url}/probe"), 60, what="an answer through the proxy")

    def instance_lists_it() -> bool:  # under the same name "" as GET: one name rule for all
        status = plane.get("serveinstance", "default", namespace).get("status") or {}
        return (status.get("applications") or {}).get("", {}).get("status") == "RUNNING"

    wait_for(instance_lists_it, 30, what='the ServeInstance status listing application ""')

    # A multi-application PUT replaces it; GET of the family then reads the deployed config.
    assert api.put([PROBE])[0] == 200
    # (the replaced application is listed as DELETING until its pods are gone)
    wait_for(lambda: api.http("GET", base) == (200, PROBE), 60, what="only the new application")
    assert api.http("DELETE", base)[0] == 200
    wait_for(lambda: remaining(plane, namespace) == "", 90, interval_s=0.5, what="all gone")


def test_status_when_nothing_runs_starts_the_serving_layer(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    api = AdminApi(operator)
    status, body = api.http("GET", f"{api.url}/api/serve/deployments/status")
    assert status == 200
    assert body["app_status"]["status"] == "NOT_STARTED"
    assert control_plane.exists("serveinstance", "default", namespace)
    assert api.details()["controller_info"]["node_id"]


@needs_ray_serve
def test_ray_serve_cli_against_the_operator(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    plane, api = control_plane, AdminApi(operator)

    def serve(*args: str) -> str:
        # Ray's client sends its token as "Authorization: Bearer": a Kubernetes token works
        return ray_cli.serve(api.url, *args, token=api.token)

    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config([PROBE])))
    api.use_tests_image()
    serve("deploy", str(path))
    assert cr_names(plane, namespace) == {"probe"}
    api.wait_running("probe")

    status = yaml.safe_load(serve("status"))
    assert status["applications"]["probe"]["status"] == "RUNNING"
    assert status["applications"]["probe"]["deployments"]["Probe"]["status"] == "HEALTHY"
    (deployed,) = yaml.safe_load_all(serve("config"))
    assert deployed == PROBE

    serve("shutdown", "-y")
    wait_for(lambda: remaining(plane, namespace) == "", 90, interval_s=0.5, what="all gone")
    wait_for(lambda: api.details() == EMPTY, 30, what="an empty GET")


# --------------------------------------------------------------------------- authentication


def test_callers_need_a_token_and_the_rbac_rights_of_their_request(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    url = f"http://127.0.0.1:{operator.port}"
    applications = f"{url}/api/serve/applications/"

    # No token, or one the API server does not accept: 401 with a Bearer challenge.
    for token in (None, "not-a-token", plane.token[::-1]):
        status, body, challenge = raw_request(applications, token=token)
        assert status == 401, body
        assert challenge.startswith("Bearer")
    assert raw_request(f"{url}/api/ray/version")[0] == 401
    assert http("GET", f"{url}/-/healthz") == (200, "success")  # probes stay open

    # A ServiceAccount that may only read: GET works, writes are 403 naming what is missing.
    viewer = AdminApi(operator, account_token(plane, namespace, "viewer", ["get", "list"]))
    assert viewer.details() == EMPTY
    status, body = viewer.put([PROBE], tests_image=False)  # creates nothing, not even that
    assert status == 403, body
    assert "create serveinstances.kubeserve.io" in body["error"]
    assert "delete serveapplications.kubeserve.io" in body["error"]
    assert "system:serviceaccount:" + namespace + ":viewer" in body["error"]
    assert viewer.http("DELETE", applications)[0] == 403
    assert not cr_names(plane, namespace)
    assert not plane.exists("serveinstance", "default", namespace)

    # One whose Role grants the verbs a deployment uses: PUT, GET and DELETE work.
    verbs = ["get", "list", "create", "patch", "delete"]
    deployer = AdminApi(operator, account_token(plane, namespace, "deployer", verbs))
    status, body = deployer.put([PROBE])
    assert status == 200, (body, operator.log())
    assert cr_names(plane, namespace) == {"probe"}
    assert deployer.details()["applications"]["probe"]["deployed_app_config"] == PROBE
    assert viewer.details()["applications"]["probe"]["deployed_app_config"] == PROBE
    assert deployer.http("DELETE", applications)[0] == 200
    wait_for(lambda: remaining(plane, namespace) == "", 90, interval_s=0.5, what="all gone")


def test_external_scaler_sets_the_deployments_replicas(
    control_plane: ControlPlane,
    operator: OperatorProcess,
    namespace: str,
) -> None:
    plane, api = control_plane, AdminApi(operator)
    app = {
        "name": "probe",
        "route_prefix": "/probe",
        "import_path": "e2e_probe:app",
        "deployments": [{"name": "Probe", **SMALL_RAY_REPLICA}],  # two fit on a 2-CPU node
    }
    scale = f"{api.url}/api/v1/applications/probe/deployments/Probe/scale"
    assert api.put([app])[0] == 200
    wait_for(lambda: (api.details()["applications"].get("probe") or {}).get("status") == "RUNNING")
    status, body = api.http("POST", scale, {"target_num_replicas": 2})
    assert status == 412 and "external_scaler_enabled" in body["error"], body

    assert api.put([{**app, "external_scaler_enabled": True}])[0] == 200
    assert api.http("POST", scale, {"target_num_replicas": 2})[0] == 200

    def replicas() -> int:
        deployment = api.details()["applications"]["probe"]["deployments"]["Probe"]
        running = [r for r in deployment["replicas"] if r["state"] == "RUNNING"]
        return len(running) if deployment["target_num_replicas"] == 2 else 0

    wait_for(lambda: replicas() == 2, 120, what="2 running replicas")
    workload = plane.get(
        "deployments", namespace=namespace, selector="app.kubernetes.io/component=replica"
    )
    assert [d["spec"]["replicas"] for d in workload["items"]] == [2]
    scaled = [
        e
        for e in plane.get("events", namespace=namespace)["items"]
        if e["reason"] == "Scaled" and e["involvedObject"]["kind"] == "ServeApplication"
    ]
    assert [(e["type"], e["message"]) for e in scaled] == [
        ("Normal", "deployment Probe: 1 -> 2 replicas (set by the external scaler)")
    ]
    missing = f"{api.url}/api/v1/applications/probe/deployments/Nope/scale"
    assert api.http("POST", missing, {"target_num_replicas": 1})[0] == 404
    assert api.http("DELETE", f"{api.url}/api/serve/applications/")[0] == 200


def test_target_capacity_scales_the_deployments(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane, api = control_plane, AdminApi(operator)
    app = {
        "name": "probe",
        "route_prefix": "/probe",
        "import_path": "e2e_probe:app",
        "deployments": [{"name": "Probe", "num_replicas": 3, **SMALL_RAY_REPLICA}],
    }
    api.use_tests_image()
    body = {**config([app]), "target_capacity": 34}
    assert api.http("PUT", f"{api.url}/api/serve/applications/", body)[0] == 200
    selector = "app.kubernetes.io/component=replica"

    def replicas() -> list[int]:
        workloads = plane.get("deployments", namespace=namespace, selector=selector)["items"]
        return [d["spec"]["replicas"] for d in workloads]

    wait_for(lambda: replicas() == [1], 60, what="3 replicas at 34% = 1")
    assert api.details()["target_capacity"] == 34
    assert api.put([app])[0] == 200
    wait_for(lambda: replicas() == [3], 60, what="3 replicas without a capacity")
    assert api.http("DELETE", f"{api.url}/api/serve/applications/")[0] == 200
