"""A small JSON client for the Kubernetes API, shared by the operator and in-cluster processes.

kubernetes_asyncio provides configuration (kubeconfig or in-cluster service account), auth and the
HTTP session; this module adds the handful of verbs kubeserve uses on plain dicts, so any resource
(built-in or custom) is handled the same way:

* :meth:`Kube.apply` is server-side apply with field manager ``kubeserve`` and strict field
  validation: idempotent, and fields kubeserve stops setting are removed;
* :meth:`Kube.watch` streams events with bookmarks and resumes from the last resourceVersion;
* :meth:`Kube.list_with_version` lists in pages (``limit`` and ``continue``) when asked to.

* :meth:`Kube.fenced` is a view of the same client whose writes are refused locally unless a
  condition holds (the operator's reconcilers write only while their process holds the leader's
  Lease).

Errors::

    KubeError (status, reason, message)
     ├── KubeNotFound   404
     ├── KubeConflict   409
     └── KubeFenced     (never sent: this process may not write now)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from kubeserve.runtime.kubernetes.contract import API_VERSION

log = logging.getLogger(__name__)

FIELD_MANAGER = "kubeserve"
#: times a paginated list starts over when its snapshot expired between two pages
LIST_RESTARTS = 3
#: objects per page of an informer's list (the pods of a thousand applications are 6,000; in one
#: answer, a list of them outlasted the API server's 60 s request timeout on a loaded machine)
INFORMER_PAGE_SIZE = 500

#: kind -> (api group/version path prefix, plural); the resources kubeserve touches.
RESOURCES: dict[str, tuple[str, str]] = {
    "Namespace": ("api/v1", "namespaces"),
    "Pod": ("api/v1", "pods"),
    "Service": ("api/v1", "services"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Secret": ("api/v1", "secrets"),
    "ServiceAccount": ("api/v1", "serviceaccounts"),
    "Event": ("api/v1", "events"),
    "Lease": ("apis/coordination.k8s.io/v1", "leases"),
    "Deployment": ("apis/apps/v1", "deployments"),
    "DaemonSet": ("apis/apps/v1", "daemonsets"),
    "Job": ("apis/batch/v1", "jobs"),
    "Role": ("apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "EndpointSlice": ("apis/discovery.k8s.io/v1", "endpointslices"),
    "NetworkPolicy": ("apis/networking.k8s.io/v1", "networkpolicies"),
    "PodDisruptionBudget": ("apis/policy/v1", "poddisruptionbudgets"),
    "TokenReview": ("apis/authentication.k8s.io/v1", "tokenreviews"),
    "SubjectAccessReview": ("apis/authorization.k8s.io/v1", "subjectaccessreviews"),
    "ServeInstance": (f"apis/{API_VERSION}", "serveinstances"),
    "ServeApplication": (f"apis/{API_VERSION}", "serveapplications"),
}


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class KubeNotFound(KubeError):
    pass


class KubeFenced(KubeError):
    """A write this process refused to send: the client is fenced (see :meth:`Kube.fenced`)."""

    def __init__(self, method: str, url: str) -> None:
        super().__init__(503, "Fenced", f"{method} {url} not sent: this process may not write now")


class KubeConflict(KubeError):
    pass


def path(kind: str, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
    prefix, plural = RESOURCES[kind]
    parts = [prefix]
    if namespace is not None and kind != "Namespace":
        parts += ["namespaces", quote(namespace)]
    parts.append(plural)
    if name is not None:
        parts.append(quote(name))
    if sub:
        parts.append(sub)
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    object: dict[str, Any]


@dataclass
class RequestCounts:
    """Requests a client sent (shared by its fenced views)."""

    #: all requests, watches included: the operator's "API requests when idle" figure
    requests: int = 0
    #: requests that change something (every verb but GET)
    writes: int = 0


class Kube:
    """Owns one kubernetes_asyncio ApiClient (one HTTP connection pool)."""

    def __init__(
        self,
        api: client.ApiClient,
        counts: RequestCounts | None = None,
        may_write: Callable[[], bool] | None = None,
        writes: asyncio.Semaphore | None = None,
    ) -> None:
        self.api = api
        self.counts = counts or RequestCounts()
        self._may_write = may_write
        #: bounds the writes in flight (shared with the fenced views); None: unbounded
        self._writes = writes

    def limit_writes(self, in_flight: int) -> None:
        """At most ``in_flight`` writes of this client (and of the fenced views made from it
        afterwards) at once; the others wait their turn. A controller that fans its writes out
        must not queue more at the API server than the other controllers can get through (on
        a busy API server every request waits behind those in flight)."""
        self._writes = asyncio.Semaphore(in_flight)

    @property
    def requests(self) -> int:
        return self.counts.requests

    def fenced(self, may_write: Callable[[], bool]) -> Kube:
        """This client (same connections, same counts) refusing every write with
        :class:`KubeFenced`, before sending it, whenever ``may_write()`` is false."""
        return Kube(self.api, self.counts, may_write, self._writes)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """From ``kubeconfig`` when given, else in-cluster, else the default kubeconfig."""
        configuration = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            try:
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            except config.ConfigException:
                await config.load_kube_config(client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        if method == "GET" or self._writes is None:
            return await self._send(method, url, body, query, content_type)
        async with self._writes:
            return await self._send(method, url, body, query, content_type)

    async def _send(
        self,
        method: str,
        url: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> Any:
        if method != "GET":
            if self._may_write is not None and not self._may_write():
                raise KubeFenced(method, url)
            self.counts.writes += 1
        self.counts.requests += 1
        try:
            return await self.api.call_api(
                url,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map={200: "object", 201: "object", 202: "object"},
                _return_http_data_only=True,
            )
        except ApiException as exc:
            raise _error(exc) from None

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return dict(await self.request("GET", path(kind, namespace, name)))
        except KubeNotFound:
            return None

    async def list_items(
        self, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        return (await self.list_with_version(kind, namespace, label_selector))[0]

    async def list_with_version(
        self, kind: str, namespace: str | None, label_selector: str = "", *, page_size: int = 0
    ) -> tuple[list[dict[str, Any]], str]:
        """The items and the list's resourceVersion (where a watch resumes).

        With ``page_size``, in pages of at most that many objects (``limit`` and ``continue``):
        every page is a short request of one snapshot, where a list of thousands of pods in
        one answer may outlast the API server's request timeout. A continue token that
        expired (410 Gone: etcd compacted the snapshot) starts the list over at a new one, at
        most :data:`LIST_RESTARTS` times."""
        query = {"labelSelector": label_selector} if label_selector else {}
        if page_size:
            query["limit"] = str(page_size)
        items: list[dict[str, Any]] = []
        version, token, restarts = "", "", 0
        while True:
            page = {**query, "continue": token} if token else query
            try:
                body = await self.request("GET", path(kind, namespace), query=page or None)
            except KubeError as exc:
                if exc.status != 410 or not token or restarts >= LIST_RESTARTS:
                    raise
                items, version, token, restarts = [], "", "", restarts + 1
                continue
            items.extend(body.get("items", []))
            metadata = body.get("metadata", {})
            version = version or str(metadata.get("resourceVersion", ""))
            token = str(metadata.get("continue") or "")
            if not token:
                return items, version

    async def create(
        self, kind: str, namespace: str | None, body: Mapping[str, Any], *, dry_run: bool = False
    ) -> Any:
        """POST ``body``; ``dry_run``: admission and validation only, nothing stored."""
        query = {"dryRun": "All"} if dry_run else None
        return await self.request("POST", path(kind, namespace), dict(body), query=query)

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of a whole object kubeserve owns (force: kubeserve is the owner)."""
        meta = obj["metadata"]
        url = path(obj["kind"], meta.get("namespace"), meta["name"])
        query = {"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"}
        return dict(
            await self.request(
                "PATCH", url, dict(obj), query=query, content_type="application/apply-patch+yaml"
            )
        )

    async def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT of a whole object; with ``metadata.resourceVersion`` a compare-and-swap
        (:class:`KubeConflict` when the object changed since it was read)."""
        meta = obj["metadata"]
        url = path(obj["kind"], meta.get("namespace"), meta["name"])
        return dict(await self.request("PUT", url, dict(obj)))

    async def merge_patch(
        self, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any], sub: str = ""
    ) -> dict[str, Any]:
        return dict(
            await self.request(
                "PATCH",
                path(kind, namespace, name, sub),
                dict(patch),
                content_type="application/merge-patch+json",
            )
        )

    async def strategic_patch(
        self, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A strategic merge patch (built-in kinds only): lists with a merge key merge by it, so
        ``metadata.ownerReferences`` gains or loses one entry (by ``uid``; ``"$patch":
        "delete"`` removes it) without reading the others, however many clients patch at once."""
        return dict(
            await self.request(
                "PATCH",
                path(kind, namespace, name),
                dict(patch),
                content_type="application/strategic-merge-patch+json",
            )
        )

    async def json_patch(
        self, kind: str, namespace: str | None, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902), applied atomically by the API server: a failed ``test``
        operation refuses the whole of it (:class:`KubeError` 422)."""
        return dict(
            await self.request(
                "PATCH",
                path(kind, namespace, name),
                [dict(operation) for operation in operations],
                content_type="application/json-patch+json",
            )
        )

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        propagation: str = "Background",
        resource_version: str | None = None,
    ) -> None:
        """Delete (gone already is fine); with ``resource_version`` only that version of it
        (:class:`KubeConflict` when it changed since)."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": propagation,
        }
        if resource_version is not None:
            body["preconditions"] = {"resourceVersion": resource_version}
        with contextlib.suppress(KubeNotFound):
            await self.request("DELETE", path(kind, namespace, name), body)

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        label_selector: str,
        resource_version: str,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """One watch request from ``resource_version``; ends when the server ends it.

        Bookmarks are yielded too (type ``BOOKMARK``) so callers can advance their version.
        """
        query = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        if label_selector:
            query["labelSelector"] = label_selector
        if resource_version:
            query["resourceVersion"] = resource_version
        self.counts.requests += 1
        try:
            response = await self.api.call_api(
                path(kind, namespace),
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout_s + 30,
            )
        except ApiException as exc:
            raise _error(exc) from None
        async with response:
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise _status_error(event["object"])
                    yield WatchEvent(event["type"], event["object"])


#: an informer's per-change callback: the event type (``ADDED``, ``MODIFIED``, ``DELETED``), the
#: object as cached (transformed) and the version it replaced (None when new)
ChangeListener = Callable[[str, dict[str, Any], dict[str, Any] | None], None]


class Informer:
    """A local cache of one kind of object, kept current by list-then-watch.

    ``on_change`` receives the whole cache (name -> object) after the first list and after every
    change; ``on_event`` receives each change alone (a re-list as the objects it added and
    removed); neither may block. The informer lists in pages of :data:`INFORMER_PAGE_SIZE`,
    resumes each watch the server ends at the last version it saw, and re-lists after the
    watch expires (410 Gone) or fails, with backoff, so callers always converge to the server's
    state.

    ``transform`` maps each object before it is cached (keep only the fields the caller reads:
    a cache of thousands of pods is most of an operator's memory). ``index_labels`` are label
    keys whose values index the cache per namespace (:meth:`indexed`), as the namespace itself
    does (:meth:`in_namespace`): a lookup by them reads its bucket, not every object.
    """

    def __init__(
        self,
        kube: Kube,
        kind: str,
        namespace: str | None,
        on_change: Callable[[dict[str, dict[str, Any]]], None] | None = None,
        label_selector: str = "",
        *,
        on_event: ChangeListener | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        index_labels: tuple[str, ...] = (),
    ) -> None:
        self._kube, self._kind, self._namespace = kube, kind, namespace
        self._selector, self._on_change, self._on_event = label_selector, on_change, on_event
        self._transform = transform or (lambda obj: obj)
        self._index_labels = index_labels
        self.objects: dict[str, dict[str, Any]] = {}
        #: (namespace, label, value) -> keys; label "" is the namespace's bucket
        self._index: dict[tuple[str, str, str], set[str]] = {}
        self.synced = asyncio.Event()

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        return self._bucket((namespace, "", ""))

    def indexed(self, namespace: str, label: str, value: str) -> list[dict[str, Any]]:
        """The cached objects of ``namespace`` labelled ``label=value`` (an index label)."""
        return self._bucket((namespace, label, value))

    def _bucket(self, entry: tuple[str, str, str]) -> list[dict[str, Any]]:
        return [self.objects[key] for key in self._index.get(entry, ())]

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._list_and_watch()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server restarts, connections drop: re-list
                log.warning(
                    "watch of %s failed (%s); re-listing in %.1f s", self._kind, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _list_and_watch(self) -> None:
        items, version = await self._kube.list_with_version(
            self._kind, self._namespace, self._selector, page_size=INFORMER_PAGE_SIZE
        )
        fresh = {_key(o): self._transform(o) for o in items}
        before, self.objects, self._index = self.objects, {}, {}
        for key, obj in fresh.items():
            self._store(key, obj)
        del items, fresh
        if self._on_event is not None:
            for key, obj in before.items():
                if key not in self.objects:
                    self._on_event("DELETED", obj, obj)
            for key, obj in self.objects.items():
                self._on_event("ADDED", obj, before.get(key))
        if self._on_change is not None:
            self._on_change(self.objects)
        self.synced.set()
        while True:
            async for event in self._kube.watch(
                self._kind, self._namespace, self._selector, version
            ):
                version = event.object["metadata"].get("resourceVersion", version)
                if event.type == "BOOKMARK":
                    continue
                obj = self._transform(event.object)
                old = self.objects.get(_key(obj))
                if event.type == "DELETED":
                    self._drop(_key(obj))
                else:
                    self._store(_key(obj), obj)
                if self._on_event is not None:
                    self._on_event(event.type, obj, old)
                if self._on_change is not None:
                    self._on_change(self.objects)

    def _entries(self, obj: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        meta = obj["metadata"]
        namespace, labels = meta.get("namespace", ""), meta.get("labels") or {}
        entries = [(namespace, "", "")]
        entries += [(namespace, k, labels[k]) for k in self._index_labels if k in labels]
        return entries

    def _store(self, key: str, obj: dict[str, Any]) -> None:
        self._drop(key)
        self.objects[key] = obj
        for entry in self._entries(obj):
            self._index.setdefault(entry, set()).add(key)

    def _drop(self, key: str) -> None:
        old = self.objects.pop(key, None)
        if old is None:
            return
        for entry in self._entries(old):
            bucket = self._index.get(entry)
            if bucket is not None:
                bucket.discard(key)
                if not bucket:
                    del self._index[entry]


def timestamp() -> str:
    """Now, as Kubernetes writes times in Events and conditions (RFC 3339, seconds, UTC)."""
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _error(exc: ApiException) -> KubeError:
    message = exc.reason or ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(exc.body or b"{}").get("message", message)
    status = int(exc.status or 0)
    error_type = {404: KubeNotFound, 409: KubeConflict}.get(status, KubeError)
    return error_type(status, str(exc.reason), message)


def _status_error(status: Mapping[str, Any]) -> KubeError:
    code = int(status.get("code", 0))
    error_type = {404: KubeNotFound, 409: KubeConflict}.get(code, KubeError)
    return error_type(code, str(status.get("reason", "")), str(status.get("message", "")))
