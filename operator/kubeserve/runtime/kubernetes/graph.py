"""Where a build Job leaves the application graph: a ConfigMap owned by the ServeApplication."""

from __future__ import annotations

from kubeserve.runtime.kubernetes.client import Kube, KubeConflict

GRAPH_KEY = "graph.json"


async def write_graph_configmap(
    namespace: str, name: str, document: str, application: str, application_uid: str
) -> None:
    """Create the ConfigMap (idempotent: a retried Job finding it already there is fine)."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "kubeserve",
                "app.kubernetes.io/managed-by": "kubeserve",
                "app.kubernetes.io/component": "build",
                "kubeserve.io/application": application,
            },
        },
        "data": {GRAPH_KEY: document},
    }
    if application_uid:
        body["metadata"]["ownerReferences"] = [  # type: ignore[index]
            {
                "apiVersion": "kubeserve.io/v1beta1",
                "kind": "ServeApplication",
                "name": application,
                "uid": application_uid,
                "blockOwnerDeletion": True,
            }
        ]
    kube = await Kube.connect()
    try:
        await kube.create("ConfigMap", namespace, body)
    except KubeConflict:
        pass
    finally:
        await kube.close()
