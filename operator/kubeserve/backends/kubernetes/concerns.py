"""Which custom resources a change of the cluster concerns, and a digest of what a pass over one
reads.

With a thousand applications in one namespace, waking every custom resource of the namespace at
each pod event (what the operator did first) makes each event a thousand passes. A child names
its application (or, when it has none, its instance) by label, so :func:`concerned` wakes that one;
only an object naming neither wakes its whole namespace, as before. An application whose status
changed (its own pass wrote it) wakes its instance, not itself again; an instance whose status
changed wakes nothing (its applications read its spec).

:func:`inputs_digest` lets the periodic resync skip an application none of whose inputs changed
since its last pass (see :meth:`~.operator.Operator.resync`): its own object, its instance's spec,
every cached child of it (pods by ``resourceVersion``, workloads and Services by generation: no
pass reads their status, :data:`_STATUS_UNREAD`, which a change of it wakes none), the shared build
it uses (its Job and ConfigMap) but for the other applications joining or leaving it, plus the
``user_config`` versions its replicas reported. Nothing one application does (its status, its
leaving a build a thousand others use) changes another's digest.

A build is shared by the applications of the same build inputs (:func:`~.render.build_name`):
its objects name no application by label but are owned by every application using them, so a
change of one wakes its owners (and the graph a build writes, before anyone owns it, the owners
of its Job).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.kubernetes.pods import creation_failure, replica_key
from kubeserve.control.fingerprint import fingerprint
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
    if kind == "ServeInstance":  # its applications render with its spec, not its status
        if _same_inputs(obj, old):
            return set()  # its own pass wrote its status: nothing reads that but the admin API
        name = obj["metadata"]["name"]
        apps = cache.objects("ServeApplication", namespace)
        return {key_of(kind, obj)} | {
            key_of("ServeApplication", app) for app in apps if contract.instance_of(app) == name
        }
    if kind in _STATUS_UNREAD and _only_status_changed(obj, old):
        failing = kind == "Deployment" and creation_failure(obj) != creation_failure(old)
        if not failing:  # a Deployment that starts or stops failing to create pods is reported
            return set()
    labels = obj["metadata"].get("labels") or {}
    if labels.get(contract.COMPONENT_LABEL) == contract.COMPONENT_BUILD and kind in _BUILD_KINDS:
        users = _build_users(cache, kind, obj, old)
        if users is not None:
            return users
    for label, owner_kind in (
        (contract.APPLICATION_LABEL, "ServeApplication"),
        (contract.INSTANCE_LABEL, "ServeInstance"),
    ):
        if label in labels:
            return {
                key_of(owner_kind, o) for o in _named(cache, owner_kind, namespace, labels[label])
            }
    return {key_of(k, o) for k in CUSTOM_KINDS for o in cache.objects(k, namespace)}


#: Children whose status no pass reads (what a pass observes is its pods and its build Job), but
#: for a Deployment's ``ReplicaFailure`` condition (:func:`~.pods.creation_failure`): their
#: controllers rewrite it at every pod event (a Deployment's counts, a budget's allowed
#: disruptions), and the controller-manager works through its queue of a thousand budgets
#: minutes after a roll-out ends.
_STATUS_UNREAD = ("Deployment", "DaemonSet", "PodDisruptionBudget", "Service")


def _only_status_changed(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    if old is None:
        return False
    ignored = ("resourceVersion", "managedFields")
    meta = {k: v for k, v in obj["metadata"].items() if k not in ignored}
    before = {k: v for k, v in old["metadata"].items() if k not in ignored}
    rest = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    rest_before = {k: v for k, v in old.items() if k not in ("metadata", "status")}
    return meta == before and rest == rest_before


#: the kinds of a build: its Job, its pod, the graph ConfigMap it writes
_BUILD_KINDS = ("Job", "Pod", "ConfigMap")


def _build_users(
    cache: ClusterCache, kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> set[str] | None:
    """The applications a change of a (shared) build concerns: the owners of its Job and of its
    ConfigMap (one name for both), so that the graph a build writes, owned by none yet, wakes
    the applications waiting on its Job. A change of nothing but the owners (an application
    joining a build a thousand others use) wakes only the owners it added. ``None`` for an
    object of no known build (a pod without its Job's name)."""
    meta = obj["metadata"]
    namespace = meta.get("namespace", "")
    if old is not None and kind != "Pod" and _only_owners_changed(obj, old):
        before = {o.get("uid") for o in old["metadata"].get("ownerReferences") or []}
        return _owner_keys(namespace, [o for o in _owners(obj) if o.get("uid") not in before])
    name = (meta.get("labels") or {}).get("job-name") if kind == "Pod" else meta["name"]
    if not name:
        return None
    owners = [] if kind == "Pod" else _owners(obj)
    for other in ("Job", "ConfigMap"):
        if other != kind:
            found = cache.get(other, namespace, str(name))
            owners += [] if found is None else _owners(found)
    return _owner_keys(namespace, owners)


def _owners(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(obj["metadata"].get("ownerReferences") or [])


def _owner_keys(namespace: str, owners: list[Mapping[str, Any]]) -> set[str]:
    return {
        f"ServeApplication/{namespace}/{o['name']}"
        for o in owners
        if o.get("kind") == "ServeApplication"
    }


def _only_owners_changed(obj: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    ignored = ("ownerReferences", "resourceVersion", "managedFields")
    meta = {k: v for k, v in obj["metadata"].items() if k not in ignored}
    before = {k: v for k, v in old["metadata"].items() if k not in ignored}
    rest = {k: v for k, v in obj.items() if k != "metadata"}
    rest_before = {k: v for k, v in old.items() if k != "metadata"}
    return meta == before and rest == rest_before


#: what a pass over an application reads of its own object, besides its spec
_READ_METADATA = ("annotations", "ownerReferences", "deletionTimestamp", "generation", "uid")


def _same_inputs(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether a custom resource changed only in what no pass reads: its status (its own pass
    writes it), kopf's finalizer and bookkeeping. An application's status the operator wrote
    wakes only its instance; an instance's wakes nothing (its applications read its spec: with
    a thousand of them, waking them all at each write of the instance's status, every few
    seconds while any application changes, made each change wait behind a thousand passes)."""
    return old is not None and _read_inputs(obj) == _read_inputs(old)


def _read_inputs(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a pass reads of a custom resource (its own, or its applications' of an instance)."""
    meta = obj["metadata"]
    return (obj.get("spec"), *(meta.get(field) for field in _READ_METADATA))


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
    cache: ClusterCache,
    app: Mapping[str, Any],
    user_configs: Mapping[str, str],
    build: str | None = None,
) -> str:
    """A digest of what a pass over the application ``app`` reads (see the module); ``build``:
    the name of the shared build its last pass used (its Job and ConfigMap)."""
    meta = app["metadata"]
    namespace = meta["namespace"]
    instance = cache.get("ServeInstance", namespace, contract.instance_of(app))
    parts = [meta.get("resourceVersion", ""), _inputs_version(instance)]
    label = contract.label_value(meta["name"])
    for kind in ("Deployment", "DaemonSet", "Service", "Job", "ConfigMap", "Pod"):
        children = cache.objects(kind, namespace, {contract.APPLICATION_LABEL: label})
        for child in sorted(children, key=lambda c: str(c["metadata"]["name"])):
            version = (
                str(child["metadata"].get("generation", ""))
                if kind in _STATUS_UNREAD  # (its spec's: its status moves with its pods)
                else _version(child)
            )
            parts += [kind, child["metadata"]["name"], version]
            if kind == "Pod":
                parts.append(user_configs.get(replica_key(child), ""))
    for kind in ("Job", "ConfigMap"):
        if build is not None:
            parts += [kind, build, _build_version(cache.get(kind, namespace, build), meta["uid"])]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _inputs_version(obj: Mapping[str, Any] | None) -> str:
    """What of ``obj`` a pass reads, as a string (not its ``resourceVersion``: an instance's
    status, rewritten as its applications change, would count as a change of every one)."""
    return "" if obj is None else fingerprint(_read_inputs(obj))


def _build_version(obj: Mapping[str, Any] | None, uid: str) -> str:
    """What of a shared build object a pass over the application ``uid`` reads: all of it but
    its other owners (and its ``resourceVersion``, which they change)."""
    if obj is None:
        return ""
    ignored = ("ownerReferences", "resourceVersion", "managedFields")
    meta = {k: v for k, v in obj["metadata"].items() if k not in ignored}
    owned = uid in {str(o.get("uid")) for o in _owners(obj)}
    return fingerprint([meta, {k: v for k, v in obj.items() if k != "metadata"}, owned])


def _version(obj: Mapping[str, Any] | None) -> str:
    return "" if obj is None else str(obj["metadata"].get("resourceVersion", ""))
