"""``tracingConfig`` on a real node: the proxy and replica pods trace one request as one trace.

No exporter given: Ray's default (kubeserve's in a pod) writes every span as a JSON line to the
container's output, so ``kubectl logs`` of the proxy's and the replicas' pods holds the trace.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from support.common import wait_for
from support.k8s_operator import (
    SMALL_REPLICA,
    OperatorProcess,
    application,
    instance,
    proxy_service_url,
    text_answer,
    wait_ready,
)
from support.node_cluster import NodeCluster

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def logged_spans(node: NodeCluster, namespace: str) -> list[dict[str, Any]]:
    """The spans every pod of the instance wrote to its output, each with the pod's component."""
    found = []
    for pod in node.get("pods", namespace=namespace)["items"]:
        component = pod["metadata"]["labels"].get("app.kubernetes.io/component", "")
        for line in node.pod_log(namespace, pod["metadata"]["name"]).splitlines():
            if line.startswith('{"name"'):
                found.append({**json.loads(line), "pod_component": component})
    return found


def traced_app(node: NodeCluster, namespace: str, tracing: dict[str, Any] | None) -> dict[str, Any]:
    """Apply the instance (its ``tracingConfig``, when given) and ``ks_tracing_app`` at
    ``/traced``, in small replicas; returns the instance, to change and apply again."""
    serving = instance(namespace)
    if tracing is not None:
        serving["spec"]["tracingConfig"] = tracing
    small = [{"name": name, **SMALL_REPLICA} for name in ("Ingress", "Downstream")]
    traced = application(
        namespace, "traced", "ks_tracing_app:app", routePrefix="/traced", deployments=small
    )
    node.apply([serving, traced])
    return serving


def test_a_request_is_one_trace_across_the_proxy_and_replica_pods(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    ns = node_namespace
    traced_app(node, ns, {"enabled": True, "samplingRatio": 1.0})
    wait_ready(node, node_operator, ns, "traced")
    url = proxy_service_url(node, ns, "/traced")
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    request = urllib.request.Request(url, headers={"traceparent": traceparent})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
        request_id = response.headers["x-request-id"]
    assert answer["ingress"]["otel_loaded"] and answer["ingress"]["trace_id"] == CLIENT_TRACE

    def trace() -> dict[str, dict[str, Any]] | None:
        mine = {
            s["name"]: s
            for s in logged_spans(node, ns)
            if s["attributes"].get("request_id") == request_id
        }
        return mine if len(mine) >= 6 else None

    spans = wait_for(trace, 60, what=f"the spans of request {request_id} in the pods' logs")
    proxy = spans["proxy_http_request Ingress GET /traced"]
    ingress = spans["replica_handle_request Ingress __call__"]
    handle = spans["route_to_replica Downstream echo"]
    downstream = spans["replica_handle_request Downstream echo"]
    assert {s["context"]["trace_id"] for s in spans.values()} == {f"0x{CLIENT_TRACE}"}
    assert proxy["parent_id"] == f"0x{CLIENT_SPAN}" and proxy["pod_component"] == "proxy"
    assert ingress["parent_id"] == proxy["context"]["span_id"]
    assert ingress["pod_component"] == downstream["pod_component"] == "replica"
    assert handle["parent_id"] == ingress["context"]["span_id"]
    assert downstream["parent_id"] == handle["context"]["span_id"]
    assert answer["downstream"]["span_id"] == downstream["context"]["span_id"].removeprefix("0x")


def status_of(node: NodeCluster, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return dict(node.get(kind, name, namespace).get("status") or {})


def test_an_exporter_that_does_not_import_fails_the_application_saying_why(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """The operator cannot import the user's exporter; the build Job does, where the application
    runs: the application is DEPLOY_FAILED with a message naming the field, not replica pods
    that keep restarting with no reason in the application's status."""
    ns = node_namespace
    exporter = "ks_tracing_exporter:nowhere"  # the module is in the image, the function is not
    traced_app(node, ns, {"enabled": True, "exporterImportPath": exporter})

    def failed() -> dict[str, Any] | None:
        status = node.get("serveapplication", "traced", ns).get("status") or {}
        return status if status.get("appStatus") == "DEPLOY_FAILED" else None

    status = wait_for(failed, 300, interval_s=1, what="traced DEPLOY_FAILED")
    assert "tracing_config.exporter_import_path" in str(status), status
    assert exporter in str(status), status
    replicas = [
        pod
        for pod in node.get("pods", namespace=ns)["items"]
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "replica"
    ]
    assert replicas == []  # no replica was ever started with it


def test_a_tracing_config_set_later_is_checked_again_and_a_proxy_that_cannot_trace_says_why(
    node: NodeCluster, node_operator: OperatorProcess, node_namespace: str
) -> None:
    """Only the instance's tracingConfig changes: the build runs again (it is part of the build
    key), so a bad exporter fails the application naming the field, and the fix recovers it.
    The proxy pod started with the bad exporter does not serve (as Ray's proxy, whose
    constructor raises) but is no silent CrashLoopBackOff: the ServeInstance is UNHEALTHY with
    the pod's reason, while the proxy pod that ran before stays (HeadOnly)."""
    ns = node_namespace
    serving = traced_app(node, ns, None)
    wait_ready(node, node_operator, ns, "traced")
    url = proxy_service_url(node, ns, "/traced")

    exporter = "ks_tracing_exporter:nowhere"
    serving["spec"]["tracingConfig"] = {"enabled": True, "exporterImportPath": exporter}
    node.apply([serving])

    def app_failed() -> dict[str, Any] | None:
        status = status_of(node, "serveapplication", "traced", ns)
        return status if status.get("appStatus") == "DEPLOY_FAILED" else None

    status = wait_for(app_failed, 300, interval_s=1, what="traced DEPLOY_FAILED")
    assert "tracing_config.exporter_import_path" in status["message"], status
    assert exporter in status["message"], status

    def proxy_failed() -> dict[str, Any] | None:
        status = status_of(node, "serveinstance", "default", ns)
        return status if status.get("state") == "UNHEALTHY" else None

    status = wait_for(proxy_failed, 180, interval_s=1, what="the instance UNHEALTHY")
    message = status["message"]
    assert "proxy not serving" in message and "exited with code 1" in message, status
    assert f"tracing_config.exporter_import_path: exporter_import_path {exporter!r}" in message
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "ProxyFailed"), status
    (proxy,) = status["proxies"].values()  # one node: the pod that serves wins it
    assert proxy["status"] == "HEALTHY" and proxy["actorName"] not in message, status

    serving["spec"]["tracingConfig"] = {"enabled": True, "samplingRatio": 1.0}
    node.apply([serving])
    wait_ready(node, node_operator, ns, "traced")

    def traced_answer() -> dict[str, Any] | None:
        body: Any = text_answer(url)  # the JSON decoded
        answer = json.loads(body) if isinstance(body, str | bytes) else body
        return answer if answer and answer["ingress"]["otel_loaded"] else None

    wait_for(traced_answer, 180, interval_s=1, what="an answer from replicas that trace")

    def instance_running() -> dict[str, Any] | None:
        status = status_of(node, "serveinstance", "default", ns)
        return status if status.get("state") == "RUNNING" else None

    wait_for(instance_running, 180, interval_s=1, what="the instance RUNNING again")
