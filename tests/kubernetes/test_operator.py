"""The operator on a real control plane: custom resources -> Jobs, Deployments, pods -> traffic."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from typing import Any

from support.common import http, wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import (
    SMALL_REPLICA,
    OperatorProcess,
    application,
    instance,
    probe_answer,
    proxy_url,
    ready_pods,
    wait_ready,
)


def test_serve_application_applied_with_kubectl_serves_traffic(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    plane.apply(
        [
            instance(namespace),
            application(namespace, "probe", "e2e_probe:app", routePrefix="/probe"),
        ]
    )
    wait_ready(plane, operator, namespace, "probe")
    status = plane.get("serveapplication", "probe", namespace)["status"]
    assert status["appStatus"] == "RUNNING"
    assert status["deployments"]["Probe"]["status"] == "HEALTHY"
    assert status["deployments"]["Probe"]["readyReplicas"] == 1
    assert status["observedGeneration"] == 1
    assert status["lastDeployedTime"]
    table = plane.kubectl("get", "sapp", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "DEPLOYMENTS", "REPLICAS", "ROUTE", "AGE"]
    assert table[1].split()[:5] == ["probe", "RUNNING", "1/1", "1/1", "/probe"]
    url = proxy_url(plane, namespace)

    def answers() -> Any:
        try:
            status, body = http("GET", f"{url}/probe")
        except OSError:
            return None
        return body if status == 200 else None

    body = wait_for(answers, 60, what="an answer through the proxy pod")
    metrics = http("GET", f"http://127.0.0.1:{operator.metrics_port}/metrics")[1]
    assert 'kubeserve_applications{status="RUNNING"} 1' in metrics
    assert "kubeserve_operator_reconciles_total" in metrics
    replica_ips = {
        p["status"]["podIP"]
        for p in ready_pods(plane, namespace, "app.kubernetes.io/component=replica")
    }
    assert replica_ips, "no ready replica pod"
    assert body["pid"] > 0


def replica_pods(plane: ControlPlane, namespace: str) -> dict[str, int]:
    """uid -> restart count of the ready replica pods."""
    return {
        p["metadata"]["uid"]: sum(
            c.get("restartCount", 0) for c in p["status"]["containerStatuses"]
        )
        for p in ready_pods(plane, namespace, "app.kubernetes.io/component=replica")
    }


def deploy_probe(
    plane: ControlPlane, operator: OperatorProcess, namespace: str, **deployment: Any
) -> str:
    spec = {
        "routePrefix": "/probe",
        "deployments": [{"name": "Probe", **SMALL_REPLICA, **deployment}],
    }
    plane.apply([instance(namespace), application(namespace, "probe", "e2e_probe:app", **spec)])
    wait_ready(plane, operator, namespace, "probe")
    url = proxy_url(plane, namespace)
    wait_for(lambda: probe_answer(url), 60, what="an answer through the proxy pod")
    return url


def patch_probe(plane: ControlPlane, namespace: str, **deployment: Any) -> None:
    patch = {"spec": {"deployments": [{"name": "Probe", **SMALL_REPLICA, **deployment}]}}
    plane.kubectl(
        "patch", "serveapplication", "probe", "-n", namespace, "--type", "merge", "-p",
        json.dumps(patch),
    )  # fmt: skip


def ready_generation(plane: ControlPlane, namespace: str) -> int | None:
    status = plane.get("serveapplication", "probe", namespace).get("status") or {}
    ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
    if ready and ready[0]["status"] == "True":
        return int(status.get("observedGeneration") or 0)
    return None


def test_user_config_change_restarts_no_pod(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    url = deploy_probe(plane, operator, namespace, numReplicas=2, userConfig={"greeting": "hi"})
    # A new pod applies its user_config once, at start: the operator asks before it pushes.
    answers = [probe_answer(url) for _ in range(8)]
    assert {(a["config"]["greeting"], a["reconfigured"]) for a in answers} == {("hi", 1)}
    pods = replica_pods(plane, namespace)
    assert len(pods) == 2
    patch_probe(plane, namespace, numReplicas=2, userConfig={"greeting": "bonjour"})
    wait_for(lambda: ready_generation(plane, namespace) == 2, 60, what="generation 2 Ready")
    answers = [probe_answer(url) for _ in range(8)]
    assert {(a["config"]["greeting"], a["reconfigured"]) for a in answers} == {("bonjour", 2)}
    assert replica_pods(plane, namespace) == pods  # same pods, no restarts


def test_scaling_up_and_down(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    deploy_probe(plane, operator, namespace, numReplicas=1)
    deployed = []
    for generation, replicas in ((2, 3), (3, 1)):
        patch_probe(plane, namespace, numReplicas=replicas)
        try:
            wait_for(lambda g=generation: ready_generation(plane, namespace) == g, 90)
        except AssertionError:
            status = plane.get("serveapplication", "probe", namespace).get("status")
            pods = plane.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout
            raise AssertionError(
                f"{replicas} replicas not Ready: {status}\n{pods}\n{operator.log()}"
            ) from None
        wait_for(lambda n=replicas: len(replica_pods(plane, namespace)) == n, 60, what="pods")
        status = plane.get("serveapplication", "probe", namespace)["status"]
        assert status["deployments"]["Probe"]["targetReplicas"] == replicas
        assert status["deployments"]["Probe"]["readyReplicas"] == replicas
        deployed.append(status["lastDeployedTime"])
    assert deployed[0] < deployed[1]  # each spec change is a new deployment


def test_restarting_the_operator_restarts_no_pod(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    url = deploy_probe(plane, operator, namespace, userConfig={"n": 1})
    pods = replica_pods(plane, namespace)
    proxies = {
        p["metadata"]["uid"]
        for p in ready_pods(plane, namespace, "app.kubernetes.io/component=proxy")
    }
    assert probe_answer(url)["reconfigured"] == 1
    operator.stop()
    # every status write of the new operator, from before it starts
    watch = subprocess.Popen(
        [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig), "get",
         "serveapplication", "probe", "-n", namespace, "--watch", "--output-watch-events",
         "-o", "jsonpath={.object.status.appStatus} {.object.status.message}{'\\n'}"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        operator.start()
        # its first passes are done: it asked the replica what it applied and reconciled again
        wait_for(
            lambda: operator.metric("kubeserve_operator_reconciles_total") >= 3,
            60,
            what="the new operator's passes",
        )
    finally:
        watch.terminate()
    statuses = [line for line in watch.communicate()[0].splitlines() if line.strip()]
    # A new operator has not heard from the replicas yet; what it writes meanwhile must not say
    # the application, which never stopped serving, is DEPLOYING again (a GitOps tool reads it).
    assert statuses and all(line.startswith("RUNNING") for line in statuses), statuses
    patch_probe(plane, namespace, userConfig={"n": 2})  # proves the new operator is at work
    wait_for(lambda: ready_generation(plane, namespace) == 2, 60, what="generation 2 Ready")
    # The new operator asked the replica what it applied instead of pushing n=1 again: the
    # user's reconfigure ran for the change only.
    assert probe_answer(url)["config"] == {"n": 2}
    assert probe_answer(url)["reconfigured"] == 2
    assert replica_pods(plane, namespace) == pods
    assert {
        p["metadata"]["uid"]
        for p in ready_pods(plane, namespace, "app.kubernetes.io/component=proxy")
    } == proxies


def test_an_invalid_custom_resource_is_refused_naming_the_field(
    control_plane: ControlPlane, crds: None, namespace: str
) -> None:
    bad_route = application(namespace, "bad", "e2e_probe:app", routePrefix="no-slash")
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(bad_route), check=False)
    assert result.returncode != 0
    assert "routePrefix" in result.stderr
    zero = application(
        namespace, "zero", "e2e_probe:app", deployments=[{"name": "P", "numReplicas": 0}]
    )
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(zero), check=False)
    assert result.returncode != 0
    assert "numReplicas" in result.stderr
    unknown = application(namespace, "unknown", "e2e_probe:app", improtPath="x:y")
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(unknown), check=False)
    assert result.returncode != 0
    assert "improtPath" in result.stderr


def test_deleting_the_instance_garbage_collects_everything(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    deploy_probe(plane, operator, namespace)
    assert plane.exists("secret", "default-dataplane-secret", namespace)
    assert plane.exists("networkpolicy", "default-replicas", namespace)
    plane.kubectl("delete", "serveinstance", "default", "-n", namespace, "--wait=false")

    def remaining() -> str:
        kinds = "deployments,services,jobs,configmaps,pods,secrets,networkpolicies,pdb"
        out = plane.kubectl(
            "get",
            kinds,
            "-n",
            namespace,
            "-l",
            "app.kubernetes.io/managed-by=kubeserve",
            "-o",
            "name",
        ).stdout
        apps = plane.kubectl("get", "serveapplications", "-n", namespace, "-o", "name").stdout
        return (out + apps).strip()

    wait_for(lambda: remaining() == "", 90, interval_s=0.5, what="everything garbage-collected")


def wait_deploy_failed(
    plane: ControlPlane, namespace: str, name: str, timeout_s: float = 90
) -> dict[str, Any]:
    """The status of application ``name`` once DEPLOY_FAILED, its Ready condition False with
    reason DeployFailed."""

    def failed() -> dict[str, Any] | None:
        status = plane.get("serveapplication", name, namespace).get("status") or {}
        return status if status.get("appStatus") == "DEPLOY_FAILED" else None

    status: dict[str, Any] = wait_for(failed, timeout_s, what=f"{name} DEPLOY_FAILED")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "DeployFailed")
    return status


def deploy_failed_event(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    """The one DeployFailed Warning Event on application ``name``."""

    def warning() -> list[dict[str, Any]]:
        events = plane.get("events", namespace=namespace)["items"]
        return [
            e
            for e in events
            if e["reason"] == "DeployFailed" and e["involvedObject"]["name"] == name
        ]

    (event,) = wait_for(warning, 30, what=f"a DeployFailed Warning Event on {name}")
    assert event["type"] == "Warning"
    return event


def test_a_broken_import_is_deploy_failed_with_the_error(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    plane.apply([instance(namespace), application(namespace, "broken", "ks_broken_import:app")])
    status = wait_deploy_failed(plane, namespace, "broken")
    assert "ModuleNotFoundError" in status["message"] or "ImportError" in status["message"]
    event = deploy_failed_event(plane, namespace, "broken")
    assert "ks_broken_import" in event["message"] or "Error" in event["message"]


def test_composed_application_calls_through_handles_in_the_cluster(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    small = [{"name": name, **SMALL_REPLICA} for name in ("Ingress", "tokenizer")]
    spec = {
        "routePrefix": "/",
        "deployments": [{"name": "Model", "numReplicas": 2, **SMALL_REPLICA}, *small],
    }
    plane.apply(
        [instance(namespace), application(namespace, "composed", "ks_composed_app:app", **spec)]
    )
    wait_ready(plane, operator, namespace, "composed")
    status = plane.get("serveapplication", "composed", namespace)["status"]
    assert set(status["deployments"]) == {"Ingress", "Model", "tokenizer"}
    url = proxy_url(plane, namespace)

    def answer() -> Any:
        try:
            code, body = http("GET", f"{url}/?q=hello+kubernetes+world")
        except OSError:
            return None
        return body if code == 200 else None

    body = wait_for(answer, 60, what="the ingress answering through handles")
    assert body == {"words": ["hello", "kubernetes", "world"], "scores": [10, 20, 10]}


def test_overrides_for_deployments_the_app_lacks_are_deploy_failed(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    typo = application(
        namespace, "typo", "e2e_probe:app", deployments=[{"name": "Prbe", "numReplicas": 2}]
    )
    plane.apply([instance(namespace), typo])
    status = wait_deploy_failed(plane, namespace, "typo")
    assert "Deployment 'Prbe' does not exist. Available: ['Probe']" in status["message"]
    workloads = plane.get("deployments", namespace=namespace)["items"]
    assert not [d for d in workloads if "typo" in d["metadata"]["name"]]  # nothing was started


def test_a_spec_the_renderer_refuses_is_deploy_failed_with_its_message(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    plane = control_plane
    bad = application(namespace, "noimage", "e2e_probe:app", runtimeEnv={"imageUri": ""})
    plane.apply([instance(namespace), bad])
    status = wait_deploy_failed(plane, namespace, "noimage", 60)
    assert "runtime_env.image_uri must be a non-empty image reference" in status["message"]
    event = deploy_failed_event(plane, namespace, "noimage")
    assert "image_uri must be a non-empty image reference" in event["message"]
    jobs = plane.get("jobs", namespace=namespace)["items"]
    assert not [j for j in jobs if j["metadata"]["name"].startswith("noimage-")]  # nothing built


def test_autoscaling_sets_the_deployments_replicas_from_replica_load(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    """No HPA or metrics server: the operator reads the replicas' load and sets replicas."""
    plane = control_plane
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetOngoingRequests": 1,
        "metricsIntervalS": 0.5,
        "lookBackPeriodS": 2,
        "upscaleDelayS": 0,
        "downscaleDelayS": 2,
    }
    url = deploy_probe(plane, operator, namespace, autoscalingConfig=autoscaling)
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                http("GET", f"{url}/probe/slow?s=0.5", timeout=60)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(replica_pods(plane, namespace)) == 2, 120, what="2 ready replicas")
        entry = plane.get("serveapplication", "probe", namespace)["status"]["deployments"]["Probe"]
        assert entry["targetReplicas"] == 2
        assert "Upscaling from 1 to 2" in entry["lastScalingDecision"]["reason"]
    finally:
        stop.set()
        for thread in threads:
            thread.join(70)
    wait_for(lambda: len(replica_pods(plane, namespace)) == 1, 120, what="back to 1 replica")
    entry = plane.get("serveapplication", "probe", namespace)["status"]["deployments"]["Probe"]
    assert entry["targetReplicas"] == 1
    assert "Downscaling from 2 to 1" in entry["lastScalingDecision"]["reason"]


def _pods_of(plane: ControlPlane, namespace: str, app: str, deployment: str) -> int:
    selector = f"kubeserve.io/application={app},kubeserve.io/deployment={deployment}"
    return len(plane.get("pods", namespace=namespace, selector=selector)["items"])


def test_deployments_scaled_to_zero_start_a_replica_for_the_first_request(
    control_plane: ControlPlane, operator: OperatorProcess, namespace: str
) -> None:
    """``min_replicas: 0`` on Kubernetes: no replica pod while idle; the first request waits at
    the proxy pod (or at the handle in the caller's pod), which reports it to the operator; the
    operator starts a replica and the request is answered; idle again, the replica goes."""
    plane = control_plane
    to_zero = {
        "autoscalingConfig": {
            "minReplicas": 0,
            "maxReplicas": 1,
            "metricsIntervalS": 0.5,
            "lookBackPeriodS": 2,
            "upscaleDelayS": 0,
            "downscaleDelayS": 2,
            "downscaleToZeroDelayS": 2,
        },
        **SMALL_REPLICA,
    }
    direct = application(
        namespace,
        "direct",
        "ks_autoscale_app:slow",
        routePrefix="/direct",
        deployments=[{"name": "Slow", **to_zero}],
    )
    behind = application(
        namespace,
        "behind",
        "ks_autoscale_app:front",
        routePrefix="/behind",
        deployments=[{"name": "Front", **SMALL_REPLICA}, {"name": "Slow", **to_zero}],
    )
    plane.apply([instance(namespace), direct, behind])
    wait_ready(plane, operator, namespace, "direct")
    wait_ready(plane, operator, namespace, "behind")
    assert _pods_of(plane, namespace, "direct", "Slow") == 0
    assert _pods_of(plane, namespace, "behind", "Slow") == 0
    url = proxy_url(plane, namespace)
    wait_for(lambda: http("GET", f"{url}/-/routes")[1] != {}, 60, what="the proxy's routes")

    # Through the proxy pod: the request is held there until a replica is ready.
    status, body = http("GET", f"{url}/direct?s=0", timeout=120)
    assert status == 200, (body, operator.log())
    assert "pid" in body
    entry = plane.get("serveapplication", "direct", namespace)["status"]["deployments"]["Slow"]
    assert "from 0 to 1" in entry["lastScalingDecision"]["reason"], entry

    # Through a handle in the Front replica's pod: the call waits there.
    status, body = http("GET", f"{url}/behind?s=0", timeout=120)
    assert status == 200, (body, operator.log())
    assert body["backend_pid"]

    # The report endpoint takes signed reports of the instance's pods only.
    forged = f"http://127.0.0.1:{operator.port}/-/load?instance={namespace}/default&queued=%7B%7D"
    status, body = http("GET", forged)
    assert status == 403, body

    # Idle: both scale back to zero.
    wait_for(
        lambda: (
            _pods_of(plane, namespace, "direct", "Slow") == 0
            and _pods_of(plane, namespace, "behind", "Slow") == 0
        ),
        120,
        what="both Slow deployments back to zero pods",
    )
    # And up again on the next request.
    status, body = http("GET", f"{url}/direct?s=0", timeout=120)
    assert status == 200, (body, operator.log())
