"""One admin API for every watched namespace: ``/namespaces/<namespace>/...`` on the operator.

A team whose ServeInstance lives in ``team-a`` uses Ray 2.60's ``serve`` client unchanged with
``-a http://<admin>:8265/namespaces/team-a``; its token is reviewed in ``team-a``. Everything is
real: the node cluster, the operator process, RBAC, the pods of the team's instance.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import ray_cli
from support.common import http, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    SMALL_RAY_REPLICA,
    AdminApi,
    OperatorProcess,
    account_token,
    config,
    grant,
    instance,
    probe_answer,
    proxy_url,
    raw_request,
)
from support.ray_cli import needs_ray_serve

PROBE = {
    "name": "probe",
    "route_prefix": "/probe",
    "import_path": "e2e_probe:app",
    "deployments": [{"name": "Probe", "user_config": {"greeting": "team"}, **SMALL_RAY_REPLICA}],
}
EMPTY = {"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None}


@pytest.fixture
def team_a(control_plane: ControlPlane) -> Iterator[str]:
    name = control_plane.create_namespace("team-a")
    yield name
    control_plane.delete_namespace(name)


@pytest.fixture
def operator(
    control_plane: ControlPlane, crds: None, namespace: str, team_a: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator in ``namespace``, watching it and ``team_a``."""
    process = OperatorProcess(
        control_plane, namespace, tmp_path / "operator.log", also_watch=[team_a]
    )
    process.start()
    yield process
    process.stop()


@needs_ray_serve
def test_ray_client_deploys_to_a_teams_namespace(
    control_plane: ControlPlane,
    operator: OperatorProcess,
    namespace: str,
    team_a: str,
    tmp_path: Path,
) -> None:
    plane, api = control_plane, AdminApi(operator)
    address = f"{api.url}/namespaces/{team_a}"

    def serve(*args: str) -> str:
        return ray_cli.serve(address, *args, token=api.token)

    plane.apply(instance(team_a))  # the team's instance, running the tests' image
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config([PROBE])))
    serve("deploy", str(path))
    # The custom resource is written in team-a, not in the operator's namespace.
    assert plane.get("serveapplication", "probe", team_a)["spec"]["appName"] == "probe"
    assert not plane.exists("serveapplication", "probe", namespace)

    def running() -> dict[str, Any] | None:
        status = yaml.safe_load(serve("status"))
        return (
            status if status["applications"].get("probe", {}).get("status") == "RUNNING" else None
        )

    try:
        status = wait_for(running, 120, interval_s=1, what="probe RUNNING in team-a")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{operator.log()}") from None
    assert status["applications"]["probe"]["deployments"]["Probe"]["status"] == "HEALTHY"
    (deployed,) = yaml.safe_load_all(serve("config"))
    assert deployed == PROBE
    details = api.http("GET", f"{address}/api/serve/applications/")[1]
    assert details["applications"]["probe"]["deployed_app_config"] == PROBE
    assert api.details() == EMPTY  # the bare paths: the operator's own namespace, empty
    reply = wait_for(lambda: probe_answer(proxy_url(plane, team_a)), 60, what="traffic")
    assert reply["config"] == {"greeting": "team"}

    serve("shutdown", "-y")
    wait_for(
        lambda: not plane.exists("serveinstance", "default", team_a), 60, what="team-a shut down"
    )


def test_namespaced_paths_refuse_bad_names_strangers_and_unwatched_namespaces(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str, team_a: str
) -> None:
    plane, url = control_plane, f"http://127.0.0.1:{operator.port}"
    apps = f"/namespaces/{team_a}/api/serve/applications/"

    # A name that is no namespace: 400, whoever asks.
    for token in (None, plane.token):
        status, body, _ = raw_request(
            f"{url}/namespaces/Team_A/api/serve/applications/", token=token
        )
        assert (status, body) == (
            400,
            {
                "error": "invalid namespace 'Team_A' in the path: a namespace name is a DNS-1123 "
                "label (at most 63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit)",
                "details": [{"loc": ["path", "namespace"], "msg": body["error"]}],
            },
        )

    # No token, or a forged one: 401 with a Bearer challenge.
    status, body, challenge = raw_request(url + apps)
    assert (status, body["error"]) == (
        401,
        "send a Kubernetes bearer token: Authorization: Bearer ...",
    )
    assert challenge == 'Bearer realm="kubeserve"'
    status, body, _ = raw_request(url + apps, token=plane.token[::-1])
    assert (status, body["error"]) == (401, "the Kubernetes API server did not accept the token")

    # A deployer of the operator's namespace has no rights in team-a: 403 naming what is missing.
    verbs = ["get", "list", "create", "patch", "delete"]
    dev = account_token(plane, namespace, "dev", verbs)
    user = f"system:serviceaccount:{namespace}:dev"
    status, body, _ = raw_request(url + apps, token=dev)
    assert (status, body["error"]) == (
        403,
        f'forbidden: user "{user}" may not get serveinstances.kubeserve.io, list '
        f'serveapplications.kubeserve.io in namespace "{team_a}" (GET {apps} needs it)',
    )
    assert raw_request(f"{url}/api/serve/applications/", token=dev)[0] == 200  # its own: fine

    # Read rights in team-a: GET works, a PUT is 403 naming the writes, in team-a.
    grant(plane, namespace, "dev", ["get", "list"], team_a)
    as_dev = AdminApi(operator, dev)
    # (the refusal above is cached for up to 10 s: a new right takes effect within that time)
    wait_for(lambda: as_dev.http("GET", url + apps) == (200, EMPTY), 20, what="the new Role seen")
    status, body = as_dev.http("PUT", url + apps, config([PROBE]))
    assert (status, body["error"]) == (
        403,
        f'forbidden: user "{user}" may not create serveapplications.kubeserve.io, create '
        "serveinstances.kubeserve.io, delete serveapplications.kubeserve.io, patch "
        "serveapplications.kubeserve.io, patch serveinstances.kubeserve.io in namespace "
        f'"{team_a}" (PUT {apps} needs it)',
    )
    assert not plane.exists("serveinstance", "default", team_a)

    # A namespace the operator does not watch: 404 saying so, to a caller with rights there; a
    # caller without them gets the 403 and learns nothing about it.
    other = "kube-public"
    status, body = AdminApi(operator).http("GET", f"{url}/namespaces/{other}/api/ray/version")
    assert (status, body["error"]) == (
        404,
        f'namespace "{other}" is not watched by this kubeserve operator: it serves the '
        "ServeInstances of the namespaces it watches (its --watch-namespaces, the chart's "
        "watchNamespaces)",
    )
    status, body = as_dev.http("GET", f"{url}/namespaces/{other}/api/serve/applications/")
    assert status == 403 and f'namespace "{other}"' in body["error"]

    # The dashboard's namespaces: those the caller may read; its page is served for each.
    namespaces = f"{url}/api/kubeserve/namespaces"
    assert as_dev.http("GET", namespaces) == (
        200,
        {"own": namespace, "namespaces": sorted([namespace, team_a])},
    )
    stranger = account_token(plane, namespace, "stranger", [])
    grant(plane, namespace, "stranger", ["get", "list"], team_a)
    assert AdminApi(operator, stranger).http("GET", namespaces) == (
        200,
        {"own": namespace, "namespaces": [team_a]},
    )
    page = http("GET", f"{url}/namespaces/{team_a}/")
    assert page[0] == 200 and "<title>kubeserve</title>" in page[1]
