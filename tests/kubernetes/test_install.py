"""The Helm chart's objects apply cleanly to a real API server, and the operator it installs works.

The chart is rendered with a watched-namespace list (so the installed operator leaves other tests'
namespaces alone), applied with kubectl, and its operator Deployment becomes a pod on the real
node under the chart's own ServiceAccount and RBAC: a ServeApplication then reaches
Ready and serves traffic, which proves the least-privilege rules are enough.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.common import wait_for
from support.k8s_control_plane import ControlPlane
from support.k8s_operator import application, instance, probe_answer, proxy_url, ready_pods
from support.kubeserve_install import find_helm, plain_manifests, rendered_chart


def _cluster_scoped(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "FlowSchema")]


def test_plain_manifests_apply_to_the_api_server(control_plane: ControlPlane) -> None:
    """``kubectl apply -f manifests/`` (server-side dry run: the objects are valid as a whole)."""
    objects = plain_manifests()
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    rest = [o for o in objects if o["kind"] != "Namespace"]
    control_plane.apply(namespaces)  # a dry run cannot create what the others live in
    try:
        result = control_plane.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rest}),
        )  # fmt: skip
    finally:
        for ns in namespaces:
            control_plane.delete_namespace(ns["metadata"]["name"])
    assert result.stdout.count("(server dry run)") == len(rest)


@pytest.mark.skipif(find_helm() is None, reason="helm is installed by `make test` (make helm)")
def test_the_chart_installs_an_operator_that_serves_an_application(
    control_plane: ControlPlane, namespace: str
) -> None:
    plane = control_plane
    release_ns = plane.create_namespace("kubeserve-system")
    objects = rendered_chart({"watchNamespaces": [namespace]}, namespace=release_ns)
    try:
        plane.kubectl(
            "apply", "--validate=strict", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )  # fmt: skip
        wait_for(
            lambda: ready_pods(plane, release_ns, "app.kubernetes.io/name=kubeserve"),
            90,
            what="the operator pod Ready",
        )
        spec = {"routePrefix": "/probe"}
        plane.apply([instance(namespace), application(namespace, "probe", "e2e_probe:app", **spec)])
        plane.kubectl(
            "wait", "--for=condition=Ready", "serveapplication/probe", "-n", namespace,
            "--timeout=55s",
        )  # fmt: skip
        url = proxy_url(plane, namespace)
        assert wait_for(lambda: probe_answer(url), 60, what="traffic through the proxy")["pid"]
    finally:
        for obj in _cluster_scoped(objects):
            plane.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")
        plane.delete_namespace(release_ns)
