"""Where a build Job leaves the application graph: a ConfigMap owned by the ServeApplications
that use it.

The build Job writes it (:func:`write_graph_configmap`), the operator reads it from its cache
(:func:`graph_document`); its name is :func:`~.contract.graph_configmap_name`, its one key
:data:`~.contract.GRAPH_KEY`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeConflict


def graph_document(configmap: Mapping[str, Any]) -> Any:
    """The JSON document a build left in ``configmap`` (``{}`` when the key is missing).

    Raises ``ValueError`` when the value is not JSON.
    """
    return json.loads((configmap.get("data") or {}).get(contract.GRAPH_KEY, "{}"))


def graph_configmap(
    namespace: str, name: str, document: str, application: str, application_uid: str
) -> dict[str, Any]:
    """The ConfigMap a build leaves: the graph ``document`` under :data:`~.contract.GRAPH_KEY`,
    labelled as a build and, when ``application`` is given, as that application's and owned by
    it (when its uid is known). A shared build (the operator's) names none: the operator makes
    each application that uses it an owner."""
    labels = contract.selector_labels(contract.COMPONENT_BUILD, application=application or None)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels, contract.MANAGED_BY_LABEL: contract.PRODUCT},
    }
    if application and application_uid:
        owner = {
            "apiVersion": contract.API_VERSION,
            "kind": "ServeApplication",
            "name": application,
            "uid": application_uid,
        }
        metadata["ownerReferences"] = [contract.owner_reference(owner, controller=False)]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {contract.GRAPH_KEY: document},
    }


async def write_graph_configmap(
    namespace: str, name: str, document: str, application: str, application_uid: str
) -> None:
    """Create the ConfigMap (idempotent: a retried Job finding it already there is fine)."""
    body = graph_configmap(namespace, name, document, application, application_uid)
    kube = await Kube.connect()
    try:
        await kube.create("ConfigMap", namespace, body)
    except KubeConflict:
        pass
    finally:
        await kube.close()
