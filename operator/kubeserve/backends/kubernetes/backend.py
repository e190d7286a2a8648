"""The admin API over Kubernetes: custom resources in the operator's namespace are desired state.

:class:`KubernetesBackend` implements :class:`kubeserve.backends.protocol.Backend` inside the
operator process. Ownership:

* a PUT owns the *specs* of the ``ServeInstance`` named ``default`` and of its ``ServeApplication``
  objects: each spec is replaced whole (a JSON patch of ``/spec``, or a create), so it holds
  exactly the config sent (fields the client did not set are absent, nulls it sent are kept);
  applications of the instance the PUT does not list are deleted;
* the operator owns everything else (status, children); deleting the ``ServeInstance``
  garbage-collects its applications and all their children through ownerReferences;
* GETs read only the operator's caches (:class:`~kubeserve.backends.kubernetes.cache.ClusterCache`)
  and make no API request. A PUT waits (briefly) until the caches hold what it wrote, so a GET
  right after it sees the new config.

Writes are serialised by one lock, and every write step is idempotent: a PUT that fails half-way
is completed by repeating it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from pydantic.alias_generators import to_camel

from kubeserve.backends.kubernetes.autoscaling import (
    SCALE_TO_ZERO_REFUSED,
    external_replicas,
    scale_to_zero_paths,
)
from kubeserve.backends.kubernetes.cache import ClusterCache
from kubeserve.backends.kubernetes.details import (
    DEPLOYED_AT_ANNOTATION,
    ClusterView,
    ControllerIdentity,
    instance_options,
    instance_view,
    route_prefix,
)
from kubeserve.backends.protocol import (
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PreconditionFailedError,
    RejectedError,
    UnavailableError,
)
from kubeserve.backends.signed import answer_load_report
from kubeserve.control.details import instance_details
from kubeserve.control.instance import (
    app_route_prefix,
    external_scaler_disabled,
    immutable_option_conflict,
    prefix_in_use,
    tls_path_refusals,
)
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeConflict, KubeError, path
from kubeserve.schema.config import ServeApplicationSchema, ServeDeploySchema
from kubeserve.schema.errors import ErrorDetail
from kubeserve.schema.imperative import graph_too_large
from kubeserve.schema.resources import (
    API_VERSION,
    DEFAULT_INSTANCE,
    ServeApplicationSpec,
    ServeApplicationStatus,
    ServeInstanceSpec,
    ServeInstanceSpecBase,
)
from kubeserve.schema.status import ServeInstanceDetails

__all__ = [
    "FIELD_MANAGER",
    "MAX_STORED_GRAPH_BYTES",
    "SINGLE_APP_ANNOTATION",
    "KubernetesBackend",
]

#: The field manager of every write the admin API makes (``--show-managed-fields`` shows it).
FIELD_MANAGER = "kubeserve-admin-api"
#: On the ``ServeInstance``: the body of the last single-application PUT (JSON), for its GET.
SINGLE_APP_ANNOTATION = "kubeserve.io/single-app-config"
#: Spec fields of a ``ServeInstance`` that are not REST options; a PUT keeps what they hold.
_CR_ONLY_INSTANCE_FIELDS = tuple(to_camel(f) for f in ServeInstanceSpecBase.cr_only_fields)

#: The largest pickled graph (``serve.run``'s) this backend stores: a Secret's data holds at
#: most 1 MiB (etcd's default request limit is 1.5 MiB), of which 1 KiB is left for its key.
MAX_STORED_GRAPH_BYTES = 1024 * 1024 - 1024
_SECRET_LIMIT_REASON = "a Kubernetes Secret, where the operator stores it, holds at most 1 MiB"

#: Annotations of a ``ServeApplication`` the admin API owns.
_APPLICATION_ANNOTATIONS = (DEPLOYED_AT_ANNOTATION, contract.APPLICATION_NAME_ANNOTATION)

#: How long a PUT waits for objects of a previous serving layer to finish deleting.
_GONE_TIMEOUT_S = 60.0
#: How long a PUT waits for the caches to show what it wrote (the write is durable before that).
_CACHE_TIMEOUT_S = 5.0
_POLL_S = 0.1
_FORWARD_TIMEOUT_S = 2.0

Obj = dict[str, Any]


class LoadReportSink(Protocol):
    """Where the pods' load reports go (the :class:`~.operator.Operator`)."""

    @property
    def scales_to_zero(self) -> bool: ...

    def instance_secret(self, namespace: str, instance: str) -> bytes | None: ...

    def record_queued(
        self, namespace: str, instance: str, caller_id: str, queued: dict[str, int]
    ) -> None: ...

    def reports_go_to(self) -> str | None:
        """None when this process takes the reports (it reconciles); else the admin URL of the
        replica that does ("" while unknown)."""
        ...


class KubernetesBackend:
    """Implements :class:`kubeserve.backends.protocol.Backend` over the operator's client and
    caches, in ``namespace`` (which the caches must watch); ``reports`` takes the pods' load
    reports (``GET /-/load``), without which deployments cannot scale to zero."""

    def __init__(
        self,
        kube: Kube,
        cache: ClusterCache,
        namespace: str,
        instance: str = DEFAULT_INSTANCE,
        reports: LoadReportSink | None = None,
    ) -> None:
        self.kube, self.cache, self.namespace, self.instance = kube, cache, namespace, instance
        self.reports = reports
        self._lock = asyncio.Lock()
        host = socket.gethostname()
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            ip = "127.0.0.1"
        self.controller = ControllerIdentity(node_id=host, node_ip=ip, pid=os.getpid())

    async def start(self) -> None:
        """Nothing to start: the operator owns the client and the caches."""

    async def close(self) -> None:
        """Nothing to stop: the operator owns the client and the caches."""

    # -------------------------------------------------------------------------------- writes

    async def apply(
        self,
        instance: dict[str, Any],
        applications: list[dict[str, Any]],
        *,
        single_app: dict[str, Any] | None = None,
    ) -> None:
        """The declarative applications become ``applications``; those deployed with
        ``serve.run`` that it does not list keep running (unless ``single_app`` is given: its
        application becomes the only one), as on the local backend and in Ray 2.60, and a
        listed application may not take one of their route prefixes (409, nothing changed)."""
        async with self._lock, _kube_errors():
            current = await self._live("ServeInstance", self.instance)
            if current is not None:
                running = instance_options(current.get("spec") or {})
                conflict = immutable_option_conflict(running, instance)
                if conflict:
                    raise ConflictError(conflict)
            existing = {a["metadata"]["name"]: a for a in await self._applications()}
            listed = {app["name"] for app in applications}
            kept = {
                cr_name: obj
                for cr_name, obj in existing.items()
                if single_app is None
                and _imperative(obj)
                and contract.application_name(obj) not in listed
            }
            kept_prefixes = _route_prefixes(kept.values())
            for app in applications:
                conflict = prefix_in_use(app["name"], app_route_prefix(app, {}), kept_prefixes)
                if conflict:
                    raise ConflictError(conflict)
            owner = await self._write_instance(current, instance, single_app)
            written = [owner]
            targets = self._targets(applications, existing)
            for cr_name in existing:
                if cr_name not in targets.values() and cr_name not in kept:
                    await self.kube.delete("ServeApplication", self.namespace, cr_name)
            for app in applications:
                cr_name = targets[app["name"]]
                spec = _application_spec(app, self.instance)
                written.append(
                    await self._write_application(spec, app["name"], cr_name, owner, existing)
                )
            await self._await_cached(written)

    async def apply_imperative(
        self, instance: dict[str, Any], config: dict[str, Any], graph: bytes
    ) -> None:
        """``serve.run``: the application's spec holds ``pickledGraph`` (the graph's digest)
        and the graph goes into a Secret owned by the ``ServeApplication``
        (:func:`~kubeserve.runtime.kubernetes.contract.pickled_graph_secret_name`), which the
        build and replica pods mount. A graph over :data:`MAX_STORED_GRAPH_BYTES` is refused
        before anything is written.

        When the application exists, the Secret is written before the spec that names it, so
        no pod ever waits for it; a new application's Secret follows its creation at once (its
        build pod, scheduled later, finds it; the kubelet retries a mount that came too early).
        """
        if len(graph) > MAX_STORED_GRAPH_BYTES:
            raise PayloadTooLargeError(
                graph_too_large(len(graph), MAX_STORED_GRAPH_BYTES, _SECRET_LIMIT_REASON)
            )
        name = config["name"]
        spec = ServeApplicationSpec.from_imperative(config, instance=self.instance).model_dump(
            mode="json", exclude_unset=True
        )
        spec["instance"] = self.instance  # explicit, so the stored spec equals the one written
        async with self._lock, _kube_errors():
            current = await self._live("ServeInstance", self.instance)
            existing = {a["metadata"]["name"]: a for a in await self._applications()}
            conflict = prefix_in_use(
                name, config.get("route_prefix"), _route_prefixes(existing.values())
            )
            if conflict:
                raise ConflictError(conflict)
            if current is None:
                owner = await self._create(self._instance_object(instance, {}, None))
            else:  # the single-application family's one application is no longer the only one
                ops = _annotation_ops(current, {}, (SINGLE_APP_ANNOTATION,))
                owner = (
                    await self._json_patch("ServeInstance", self.instance, ops) if ops else current
                )
            cr_name = self._targets([config], existing)[name]
            before = existing.get(cr_name)
            if before is not None and not _terminating(before) and not _stale(before, owner):
                await self._store_graph(before, graph)
            written = await self._write_application(spec, name, cr_name, owner, existing)
            await self._store_graph(written, graph)
            await self._await_cached([owner, written])

    async def _store_graph(self, app: Obj, graph: bytes) -> None:
        """The Secret holding ``graph`` for ``app`` (a ``ServeApplication``), owned by it;
        immutable, and named by the graph's digest and the object's uid, so an existing one
        already holds these bytes."""
        meta = app["metadata"]
        digest = hashlib.sha256(graph).hexdigest()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": contract.pickled_graph_secret_name(meta["name"], meta["uid"], digest),
                "namespace": self.namespace,
                "labels": contract.common_labels(
                    contract.COMPONENT_PICKLED_GRAPH, self.instance, meta["name"]
                ),
                "annotations": {
                    contract.APPLICATION_NAME_ANNOTATION: contract.application_name(app)
                },
                "ownerReferences": [contract.owner_reference(app, controller=False)],
            },
            "type": "Opaque",
            "immutable": True,
            "data": {contract.PICKLED_GRAPH_KEY: base64.b64encode(graph).decode()},
        }
        with contextlib.suppress(KubeConflict):
            await self.kube.request(
                "POST", path("Secret", self.namespace), secret, query=_WRITE_QUERY
            )

    async def delete_application(self, name: str) -> None:
        async with self._lock, _kube_errors():
            for obj in await self._applications():
                if contract.application_name(obj) == name:
                    cr_name = obj["metadata"]["name"]
                    await self.kube.delete("ServeApplication", self.namespace, cr_name)

    def refusals(self, app_config: dict[str, Any]) -> list[ErrorDetail]:
        """Scaling to zero when pods cannot report to the operator (see
        :data:`~.autoscaling.SCALE_TO_ZERO_REFUSED`); the operator renders or reports everything
        else the schema accepts."""
        if self.reports is not None and self.reports.scales_to_zero:
            return []
        overrides = app_config.get("deployments") or []
        return [
            {"loc": ["deployments", *path], "msg": SCALE_TO_ZERO_REFUSED}
            for path in scale_to_zero_paths(o.get("autoscaling_config") for o in overrides)
        ]

    def instance_refusals(self, instance: dict[str, Any]) -> list[ErrorDetail]:
        """``http_options.ssl_*`` paths: TLS comes from a Secret the ServeInstance names."""
        return tls_path_refusals(instance)

    async def shutdown(self) -> None:
        async with self._lock, _kube_errors():
            await self.kube.delete("ServeInstance", self.namespace, self.instance)
            # Applications the operator has not yet made owned by the instance go explicitly.
            for obj in await self._applications():
                if not obj["metadata"].get("deletionTimestamp"):
                    name = obj["metadata"]["name"]
                    await self.kube.delete("ServeApplication", self.namespace, name)

    async def ensure_running(self, instance: dict[str, Any]) -> None:
        if self.cache.get("ServeInstance", self.namespace, self.instance) is not None:
            return
        async with self._lock, _kube_errors():
            if await self._live("ServeInstance", self.instance) is None:
                with contextlib.suppress(KubeConflict):  # created meanwhile: it runs
                    created = await self._create(self._instance_object(instance, {}, None))
                    await self._await_cached([created])

    # -------------------------------------------------------------------------------- reads

    async def single_app_config(self) -> dict[str, Any] | None:
        obj = self.cache.get("ServeInstance", self.namespace, self.instance)
        if obj is None:
            return None
        raw = (obj["metadata"].get("annotations") or {}).get(SINGLE_APP_ANNOTATION)
        if not raw:
            return None
        value = json.loads(raw)
        return value if isinstance(value, dict) else None

    async def instance_details(self) -> ServeInstanceDetails:
        namespace = self.namespace
        view = ClusterView(
            instance=self.cache.get("ServeInstance", namespace, self.instance),
            applications=self.cache.objects("ServeApplication", namespace),
            objects=lambda kind, labels: self.cache.objects(kind, namespace, labels),
            configmap=lambda name: self.cache.get("ConfigMap", namespace, name),
        )
        return instance_details(instance_view(view, self.controller))

    async def scale_deployment(self, app: str, deployment: str, target_num_replicas: int) -> None:
        """Stored in the application's ``EXTERNAL_REPLICAS_ANNOTATION`` (see
        :mod:`kubeserve.runtime.kubernetes.contract`); the operator sets the Deployment's replicas
        from it."""
        async with _kube_errors():
            current = next(
                (o for o in await self._applications() if contract.application_name(o) == app), None
            )
            if current is None:
                raise NotFoundError("Application or Deployment not found")
            if not (current.get("spec") or {}).get("externalScalerEnabled"):
                raise PreconditionFailedError(external_scaler_disabled(app, deployment))
            built = ServeApplicationStatus.of(current).deployments.keys()
            if deployment not in built:
                raise NotFoundError("Application or Deployment not found")
            key = contract.EXTERNAL_REPLICAS_ANNOTATION
            counts = external_replicas(current)
            counts[deployment] = target_num_replicas
            wanted = {key: json.dumps(counts, sort_keys=True)}
            ops = _annotation_ops(current, wanted, (key,))
            await self._json_patch("ServeApplication", current["metadata"]["name"], ops)

    async def metrics(self) -> bytes | None:
        """None: Prometheus scrapes each proxy and replica pod (their metrics port)."""
        return None

    def internal_routes(self) -> list[web.RouteDef]:
        """The pods' load reports; the data plane discovers through the Kubernetes API."""
        return [] if self.reports is None else [web.get(wire.LOAD_PATH, self._load)]

    async def _load(self, request: web.Request) -> web.Response:
        """A proxy or replica pod's report of requests waiting for replicas, signed with the
        data-plane secret of the instance it names (see :mod:`kubeserve.runtime.load_report`)."""
        reports = self.reports
        assert reports is not None
        leader = reports.reports_go_to()
        if leader is not None:
            return await _forward_load_report(request, leader)
        namespace, _, instance = request.query.get("instance", "").partition("/")
        secret = reports.instance_secret(namespace, instance) if instance else None

        def record(source: str, counts: dict[str, int]) -> None:
            reports.record_queued(namespace, instance, source, counts)

        return answer_load_report(request, secret, record)

    # -------------------------------------------------------------------------------- helpers

    async def _live(self, kind: str, name: str) -> Obj | None:
        """The object as the API server has it now; waits out a deletion in progress."""
        deadline = time.monotonic() + _GONE_TIMEOUT_S
        while True:
            obj = await self.kube.get(kind, self.namespace, name)
            if obj is None or not obj["metadata"].get("deletionTimestamp"):
                return obj
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"{kind} {self.namespace}/{name} is still being deleted; retry shortly"
                )
            await asyncio.sleep(_POLL_S)

    async def _applications(self) -> list[Obj]:
        """The instance's ``ServeApplication`` objects, listed fresh (a PUT must see them all)."""
        return [
            obj
            for obj in await self.kube.list_items("ServeApplication", self.namespace)
            if contract.instance_of(obj) == self.instance
        ]

    @staticmethod
    def _targets(applications: list[dict[str, Any]], existing: dict[str, Obj]) -> dict[str, str]:
        """Ray name -> object name: an existing object of that application keeps its name."""
        by_app = {contract.application_name(obj): cr for cr, obj in existing.items()}
        return {
            app["name"]: by_app.get(app["name"]) or contract.application_cr_name(app["name"])
            for app in applications
        }

    def _instance_object(
        self, options: dict[str, Any], current_spec: dict[str, Any], single_app: Any
    ) -> Obj:
        given = _without_nulls({**options, "applications": []})
        spec = ServeInstanceSpec.from_rest(ServeDeploySchema.model_validate(given)).model_dump(
            mode="json", exclude_unset=True
        )
        for field in _CR_ONLY_INSTANCE_FIELDS:
            if field in current_spec:
                spec[field] = current_spec[field]
        annotations = {}
        if single_app is not None:
            annotations[SINGLE_APP_ANNOTATION] = json.dumps(single_app, sort_keys=True)
        return self._object("ServeInstance", self.instance, spec, annotations)

    async def _write_instance(
        self, current: Obj | None, options: dict[str, Any], single_app: Any
    ) -> Obj:
        current_spec = (current or {}).get("spec") or {}
        wanted = self._instance_object(options, current_spec, single_app)
        if current is None:
            return await self._create(wanted)
        ops: list[Obj] = [{"op": "add", "path": "/spec", "value": wanted["spec"]}]
        annotations = wanted["metadata"].get("annotations", {})
        ops += _annotation_ops(current, annotations, (SINGLE_APP_ANNOTATION,))
        return await self._json_patch("ServeInstance", self.instance, ops)

    async def _write_application(
        self, spec: dict[str, Any], name: str, cr_name: str, owner: Obj, existing: dict[str, Obj]
    ) -> Obj:
        """Application ``name`` (its Ray name) as the object ``cr_name`` with ``spec``."""
        current = existing.get(cr_name)
        if current is not None and (_terminating(current) or _stale(current, owner)):
            # left over from a serving layer that was shut down: start this one afresh
            await self.kube.delete("ServeApplication", self.namespace, cr_name)
            current = await self._live("ServeApplication", cr_name)
        unchanged = current is not None and current.get("spec") == spec
        deployed_at = (
            (current["metadata"].get("annotations") or {}).get(DEPLOYED_AT_ANNOTATION)
            if unchanged and current is not None
            else None
        ) or repr(time.time())
        annotations = {DEPLOYED_AT_ANNOTATION: deployed_at}
        if not name:
            annotations[contract.APPLICATION_NAME_ANNOTATION] = ""
        reference = contract.owner_reference(owner, controller=False)
        if current is None:
            wanted = self._object("ServeApplication", cr_name, spec, annotations)
            wanted["metadata"]["ownerReferences"] = [reference]
            return await self._create(wanted)
        ops: list[Obj] = [{"op": "add", "path": "/spec", "value": spec}]
        ops += _annotation_ops(current, annotations, _APPLICATION_ANNOTATIONS)
        owners = current["metadata"].get("ownerReferences")
        if not owners:
            ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": [reference]})
        elif all(o.get("uid") != reference["uid"] for o in owners):
            ops.append({"op": "add", "path": "/metadata/ownerReferences/-", "value": reference})
        return await self._json_patch("ServeApplication", cr_name, ops)

    def _object(self, kind: str, name: str, spec: Obj, annotations: dict[str, str]) -> Obj:
        metadata: Obj = {"name": name, "namespace": self.namespace}
        if annotations:
            metadata["annotations"] = annotations
        return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}

    async def _create(self, obj: Obj) -> Obj:
        return dict(
            await self.kube.request(
                "POST", path(obj["kind"], self.namespace), obj, query=_WRITE_QUERY
            )
        )

    async def _json_patch(self, kind: str, name: str, ops: list[Obj]) -> Obj:
        return dict(
            await self.kube.request(
                "PATCH",
                path(kind, self.namespace, name),
                ops,
                query=_WRITE_QUERY,
                content_type="application/json-patch+json",
            )
        )

    async def _await_cached(self, written: list[Obj]) -> None:
        """Until the caches hold ``written`` (or newer), so the next GET shows them; bounded."""
        deadline = time.monotonic() + _CACHE_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._cached(obj) for obj in written):
                return
            await asyncio.sleep(_POLL_S / 4)

    def _cached(self, written: Obj) -> bool:
        meta = written["metadata"]
        cached = self.cache.get(written["kind"], self.namespace, meta["name"])
        if cached is None or cached["metadata"].get("uid") != meta.get("uid"):
            return False
        return _version_at_least(cached["metadata"], meta)


_WRITE_QUERY = {"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict"}


@contextlib.asynccontextmanager
async def _kube_errors() -> AsyncIterator[None]:
    """API server errors as the backend errors the admin API maps to HTTP."""
    try:
        yield
    except KubeError as exc:
        if exc.status in (400, 422):
            message = f"the Kubernetes API server refused the config: {exc.message}"
            raise RejectedError(message) from None
        if exc.status == 404:  # reads answer None and deletes pass: the namespace is missing
            raise NotFoundError(f"the Kubernetes API server: {exc.message}") from None
        raise UnavailableError(f"the Kubernetes API server failed the request: {exc}") from None


def _application_spec(config: dict[str, Any], instance: str) -> dict[str, Any]:
    """``ServeApplication.spec`` holding exactly the REST fields of ``config`` (camelCase).

    An empty Ray name (the single-application family's) leaves ``appName`` unset; the object
    carries an empty :data:`~kubeserve.runtime.kubernetes.contract.APPLICATION_NAME_ANNOTATION`
    instead (:func:`~kubeserve.runtime.kubernetes.contract.application_name`).
    """
    # A stand-in name to validate with (any valid one): appName is dropped below.
    rest = ServeApplicationSchema.model_validate({**config, "name": config["name"] or "unnamed"})
    spec: dict[str, Any] = ServeApplicationSpec.from_rest(rest).model_dump(
        mode="json", exclude_unset=True
    )
    if not config["name"]:
        del spec["appName"]
    spec["instance"] = instance  # explicit, so the stored spec equals the one written
    return spec


def _annotation_ops(current: Obj, wanted: dict[str, str], keys: tuple[str, ...]) -> list[Obj]:
    """JSON-patch operations making annotations ``keys`` of ``current`` what ``wanted`` says
    (absent where ``wanted`` lacks them); other annotations are left alone."""
    annotations = current["metadata"].get("annotations")
    if annotations is None:
        added = {key: wanted[key] for key in keys if key in wanted}
        return [{"op": "add", "path": "/metadata/annotations", "value": added}] if added else []
    ops: list[Obj] = []
    for key in keys:
        pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        if key in wanted:
            ops.append({"op": "add", "path": pointer, "value": wanted[key]})
        elif key in annotations:
            ops.append({"op": "remove", "path": pointer})
    return ops


def _imperative(obj: Obj) -> bool:
    """Deployed with ``serve.run``: the spec holds a pickled graph, not an import path."""
    return bool((obj.get("spec") or {}).get("pickledGraph"))


def _route_prefixes(apps: Iterable[Obj]) -> dict[str, str | None]:
    """Ray name -> route prefix (as served once built) of the applications not being deleted."""
    return {
        contract.application_name(obj): route_prefix(obj) for obj in apps if not _terminating(obj)
    }


def _terminating(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _stale(obj: Obj, owner: Obj) -> bool:
    """Owned by a ``ServeInstance`` other than ``owner`` (a deleted one, awaiting collection)."""
    return any(
        ref.get("kind") == "ServeInstance" and ref.get("uid") != owner["metadata"]["uid"]
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def _version_at_least(cached: Obj, written: Obj) -> bool:
    """Whether the cached metadata is the written version or a later one."""
    if cached.get("resourceVersion") == written.get("resourceVersion"):
        return True
    try:  # opaque by contract, but etcd revisions in practice
        return int(cached["resourceVersion"]) >= int(written["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


def _without_nulls(value: Any) -> Any:
    """``value`` without null mapping entries (in instance options, null means the default)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


async def _forward_load_report(request: web.Request, leader: str) -> web.Response:
    """A load report relayed as it came (its signature covers method and path) to the replica
    of the operator that reconciles; a 503 while there is none (the pod reports again soon)."""
    if not leader:
        return web.json_response({"error": "no operator replica leads right now"}, status=503)
    signature = request.headers.get(channel.SIGNATURE_HEADER, "")
    timeout = aiohttp.ClientTimeout(total=_FORWARD_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(
                leader.rstrip("/") + request.rel_url.raw_path_qs,
                headers={channel.SIGNATURE_HEADER: signature},
            ) as answer,
        ):
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type="application/json")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return web.json_response({"error": f"the leading operator replica: {exc}"}, status=503)
