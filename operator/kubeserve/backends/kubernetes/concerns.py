"""Which custom resources a change of the cluster concerns, and a digest of what a pass over one
reads.

With a thousand applications in one namespace, waking every custom resource of the namespace at
each pod event (what the operator did first) makes each event a thousand passes. A child names
its application (or, when it has none, its instance) by label, so :func:`concerned` wakes that one;
only an object naming neither wakes its whole namespace, as before. An application whose status
changed (its own pass wrote it) wakes its instance, not itself again.

:func:`inputs_digest` lets the periodic resync skip an application none of whose inputs changed
since its last pass (see :meth:`~.operator.Operator.resync`): its own object, its instance's, and
every cached child of it (workloads, Services, the build Job and its ConfigMap, pods), each by
``resourceVersion``, plus the ``user_config`` versions its replicas reported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.kubernetes.pods import replica_key
from kubeserve.runtime.kubernetes import contract

#: the kinds of custom resources (their keys are ``Kind/namespace/name``)
CUSTOM_KINDS = ("ServeInstance", "ServeApplication")


def key_of(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{kind}/{meta['namespace']}/{meta['name']}"


def concerned(
    cache: ClusterCache,
    kind: str,
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
) -> set[str]:
    """The keys of the custom resources whose pass reads ``obj`` (of ``kind``; ``old`` is the
    version it replaced)."""
    namespace = obj["metadata"].get("namespace", "")
    if kind == "ServeApplication":  # its instance reports the statuses of its applications
        instance = cache.get("ServeInstance", namespace, contract.instance_of(obj))
        found = set() if _same_inputs(obj, old) else {key_of(kind, obj)}
        return found if instance is None else found | {key_of("ServeInstance", instance)}
    if kind == "ServeInstance":  # its applications render with it
        name = obj["metadata"]["name"]
        apps = cache.objects("ServeApplication", namespace)
        return {key_of(kind, obj)} | {
            key_of("ServeApplication", app) for app in apps if contract.instance_of(app) == name
        }
    labels = obj["metadata"].get("labels") or {}
    for label, owner_kind in (
        (contract.APPLICATION_LABEL, "ServeApplication"),
        (contract.INSTANCE_LABEL, "ServeInstance"),
    ):
        if label in labels:
            return {
                key_of(owner_kind, o) for o in _named(cache, owner_kind, namespace, labels[label])
            }
    return {key_of(k, o) for k in CUSTOM_KINDS for o in cache.objects(k, namespace)}


#: what a pass over an application reads of its own object, besides its spec
_READ_METADATA = ("annotations", "ownerReferences", "deletionTimestamp", "generation", "uid")


def _same_inputs(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether an application changed only in what its own pass does not read: its status (the
    pass writes it), kopf's finalizer and bookkeeping. Its own pass need not run again for that:
    a status the operator wrote wakes only the instance."""
    if old is None or obj.get("spec") != old.get("spec"):
        return False
    meta, before = obj["metadata"], old["metadata"]
    return all(meta.get(field) == before.get(field) for field in _READ_METADATA)


def _named(cache: ClusterCache, kind: str, namespace: str, value: str) -> list[dict[str, Any]]:
    """The custom resources of ``kind`` whose name's label value is ``value`` (a name that is
    not a valid label value was hashed into it: the rare case, found by walking)."""
    obj = cache.get(kind, namespace, value)
    if obj is not None:
        return [obj]
    return [
        o
        for o in cache.objects(kind, namespace)
        if contract.label_value(o["metadata"]["name"]) == value
    ]


def inputs_digest(
    cache: ClusterCache, app: Mapping[str, Any], user_configs: Mapping[str, str]
) -> str:
    """A digest of what a pass over the application ``app`` reads (see the module)."""
    meta = app["metadata"]
    namespace = meta["namespace"]
    instance = cache.get("ServeInstance", namespace, contract.instance_of(app))
    parts = [meta.get("resourceVersion", ""), _version(instance)]
    label = contract.label_value(meta["name"])
    for kind in ("Deployment", "DaemonSet", "Service", "Job", "ConfigMap", "Pod"):
        children = cache.objects(kind, namespace, {contract.APPLICATION_LABEL: label})
        for child in sorted(children, key=lambda c: str(c["metadata"]["name"])):
            parts += [kind, child["metadata"]["name"], _version(child)]
            if kind == "Pod":
                parts.append(user_configs.get(replica_key(child), ""))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _version(obj: Mapping[str, Any] | None) -> str:
    return "" if obj is None else str(obj["metadata"].get("resourceVersion", ""))
