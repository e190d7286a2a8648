"""The admin API's view of the cluster (:mod:`kubeserve.backends.kubernetes.details`): it finds
what the operator built under the same names the operator gives it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubeserve.backends.kubernetes import render
from kubeserve.backends.kubernetes.details import (
    ClusterView,
    ControllerIdentity,
    app_config,
    instance_view,
)
from kubeserve.control.details import InstanceDetailsView
from kubeserve.runtime.kubernetes import contract

GRAPH = {
    "ingress": "Model",
    "deployments": [{"name": "Model", "options": {}, "outbound": [], "is_ingress": True}],
}


def test_an_application_of_a_traced_instance_shows_the_graph_its_traced_build_wrote() -> None:
    """The build key covers the instance's tracing_config (the build checks its exporter): the
    details read the ConfigMap of that key, as the operator does."""
    meta = {"namespace": "serving", "uid": "uid-inst", "name": contract.DEFAULT_INSTANCE}
    tracing = {"enabled": True, "exporterImportPath": "otel_setup:exporters"}
    inst = {"metadata": meta, "spec": {"image": "kubeserve:test", "tracingConfig": tracing}}
    app = {
        "metadata": {"name": "shop", "namespace": "serving", "uid": "uid-app", "generation": 1},
        "spec": {"importPath": "shop.main:app"},
    }
    config = app_config(app)
    assert config is not None
    operator_view = render.app_view(app, config, render.instance_view(inst).tracing_config)
    assert operator_view.build_key != operator_view.code_key
    built = render.build_name(render.instance_view(inst), operator_view)
    configmaps: dict[str, dict[str, Any]] = {
        built: {"data": {contract.GRAPH_KEY: json.dumps(GRAPH)}}
    }
    view = ClusterView(inst, [app], lambda kind, labels: [], configmaps.get)

    async def describe() -> InstanceDetailsView | None:  # as the admin API's GET, in its loop
        return instance_view(view, ControllerIdentity("node-1", "10.0.0.1", 1))

    details = asyncio.run(describe())
    assert details is not None
    (shown,) = details.applications
    assert shown.graph == GRAPH
