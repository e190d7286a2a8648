"""Proxy and replica pod specs as the operator renders them for one ServeInstance (pure), each
workload checked against the Kubernetes API's schema first (``kubernetes-validate``)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

from kubeserve.backends.kubernetes import render
from kubeserve.control import effective_config

#: the Kubernetes version the rendered objects are validated against
K8S_VERSION = "1.36.0"
Json = dict[str, Any]


def instance(**spec: Any) -> render.InstanceView:
    """The ServeInstance ``serving/default`` with ``spec`` (HeadOnly proxies unless given)."""
    meta = {"name": "default", "namespace": "serving", "uid": "uid-inst"}
    return render.instance_view({"metadata": meta, "spec": {"proxyLocation": "HeadOnly", **spec}})


def replica_pod(inst: render.InstanceView, **app_fields: Any) -> Json:
    """The pod spec of deployment ``Model`` of application ``shop`` (``app_fields`` added)."""
    config = {"name": "shop", "import_path": "shop.main:app", **app_fields}
    meta = {"name": "shop", "namespace": "serving", "uid": "uid-app", "generation": 1}
    app = render.app_view({"metadata": meta}, config, None)
    effective = effective_config.effective_deployment("Model", {}, None)
    workload = render.render_replica_workload(inst, app, render.deployment_view(config, effective))
    kubernetes_validate.validate(workload, K8S_VERSION, strict=True)
    spec: Json = workload["spec"]["template"]["spec"]
    return spec


def proxy_pod(inst: render.InstanceView) -> Json:
    """The pod spec of the instance's proxy workload."""
    workload = render.render_proxy(inst)[0]
    kubernetes_validate.validate(workload, K8S_VERSION, strict=True)
    spec: Json = workload["spec"]["template"]["spec"]
    return spec


def env(container: Json) -> dict[str, Any]:
    """A container's environment by name (a value, or its ``valueFrom``)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
