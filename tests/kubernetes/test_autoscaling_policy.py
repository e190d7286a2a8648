"""Custom autoscaling policies on Kubernetes: the operator's wiring (a policy host pod per
application with a custom policy, owned by it, reachable by the operator only, gone when the
policy goes) and an application-level policy put through the admin API deciding on real pods."""

from __future__ import annotations

from typing import Any

from support.common import wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    SMALL_RAY_REPLICA,
    AdminApi,
    OperatorProcess,
    ready_pods,
)

FAST = {"metrics_interval_s": 0.5, "upscale_delay_s": 0, "downscale_delay_s": 0}
POLICY = {
    "policy_function": "ray_policy_app:PerDeployment",
    "policy_kwargs": {"counts": {"Ingress": 1, "Scaled": 2}},
}


def two(**fields: Any) -> dict[str, Any]:
    deployments = [
        {"name": name, "autoscaling_config": {"min_replicas": 1, "max_replicas": 3, **FAST}}
        | SMALL_RAY_REPLICA
        for name in ("Ingress", "Scaled")
    ]
    return {
        "name": "both",
        "route_prefix": "/both",
        "import_path": "ray_policy_app:two",
        "deployments": deployments,
        **fields,
    }


def policy_host_diagnostics(plane: ControlPlane, namespace: str) -> str:
    pods = plane.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout
    logs = plane.kubectl(
        "logs", "deploy/both-autoscaling-policy", "-n", namespace, "--tail=30", check=False
    )
    return f"{pods}\npolicy host log:\n{logs.stdout}{logs.stderr}"


def ready(plane: ControlPlane, namespace: str, deployment: str) -> int:
    selector = f"kubeserve.io/application=both,kubeserve.io/deployment={deployment}"
    return len(ready_pods(plane, namespace, selector))


def test_an_application_policy_runs_in_its_own_pod_and_decides_for_every_deployment(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane, api = control_plane, AdminApi(operator)
    status, body = api.put([two(autoscaling_policy=POLICY)])
    assert status == 200, body  # accepted on Kubernetes too
    api.wait_running("both", timeout_s=180)

    # one pod of the application's image runs the policy; the operator asks it
    host = plane.get("deployment", "both-autoscaling-policy", namespace)
    assert [(o["kind"], o["name"]) for o in host["metadata"]["ownerReferences"]] == [
        ("ServeApplication", "both")
    ]
    container = host["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["kubeserve", "policy-host", "both"]
    assert plane.exists("networkpolicy", "default-autoscaling-policies", namespace)
    try:
        wait_for(
            lambda: (
                (ready(plane, namespace, "Ingress"), ready(plane, namespace, "Scaled")) == (1, 2)
            ),
            180,
            what="1 Ingress and 2 Scaled replicas, as the policy says",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{policy_host_diagnostics(plane, namespace)}") from None
    detail = api.details()["applications"]["both"]["deployments"]["Scaled"]
    assert detail["status"] == "HEALTHY", detail

    # without a custom policy the policy host goes
    status, body = api.put([two()])
    assert status == 200, body
    wait_for(
        lambda: not plane.exists("deployment", "both-autoscaling-policy", namespace),
        60,
        what="the policy host deleted",
    )
