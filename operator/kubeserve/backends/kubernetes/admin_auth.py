"""Who may use the operator's admin API: the cluster's own authentication and RBAC decide.

The admin API writes ``ServeInstance`` and ``ServeApplication`` objects in the operator's
namespace with the operator's (broad) rights, so each caller must hold the rights the request
would use itself:

* **authentication**: ``Authorization: Bearer <token>`` (any token the API server accepts: a
  ServiceAccount token from ``kubectl create token``, an OIDC token...) checked with a
  ``TokenReview``; without one, or with one the API server does not accept, 401 with
  ``WWW-Authenticate: Bearer``;
* **authorisation**: one ``SubjectAccessReview`` per access the request needs
  (:func:`required_access`: the verbs on ``serveinstances`` / ``serveapplications`` in the
  operator's namespace that its handler reads or writes with); a missing one is a 403 naming the
  verbs and resources;
* ``/-/healthz`` stays open (kubelet probes); every other path needs authentication. (The
  dashboard's page and files, which hold no data, never reach this middleware:
  :func:`kubeserve.api.server.create_app` serves them without it; the page then calls the API
  with the user's token like any client.)

Decisions are cached for :data:`DECISION_TTL_S` (by a digest of the token, and by user and
access), so a client polling ``GET /api/serve/applications/`` costs the API server two reviews per
10 s, not per request; a revoked token or role therefore takes effect within that time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler

from kubeserve.runtime.kubernetes.client import Kube, KubeError
from kubeserve.schema.resources import GROUP

__all__ = [
    "DECISION_TTL_S",
    "OPEN_PATHS",
    "Access",
    "KubernetesAuthorizer",
    "required_access",
]

log = logging.getLogger(__name__)

#: How long a TokenReview or SubjectAccessReview answer is reused.
DECISION_TTL_S = 10.0
#: Paths anyone may call (kubelet probes).
OPEN_PATHS = frozenset({"/-/healthz"})
_MAX_ENTRIES = 4096
_CONFIG_PATHS = frozenset({"/api/serve/applications", "/api/serve/deployments"})
_STATUS_PATH = "/api/serve/deployments/status"
#: the external scaling API: ``/api/v1/applications/{app}/deployments/{deployment}/scale``
_SCALE_PATH = re.compile(r"/api/v1/applications/[^/]+/deployments/[^/]+/scale")
#: one application by name: ``serve.run``'s PUT, ``serve.delete``'s DELETE
_APPLICATION_PATH = re.compile(r"/api/kubeserve/applications/[^/]+")
_INSTANCES = "serveinstances"
_APPLICATIONS = "serveapplications"


@dataclass(frozen=True, order=True)
class Access:
    """One verb on one resource of the group ``kubeserve.io`` in the operator's namespace."""

    verb: str
    resource: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}.{GROUP}"


_READ = (Access("get", _INSTANCES), Access("list", _APPLICATIONS))
_WRITE = (
    *_READ,
    Access("create", _INSTANCES),
    Access("patch", _INSTANCES),
    Access("create", _APPLICATIONS),
    Access("patch", _APPLICATIONS),
    Access("delete", _APPLICATIONS),
)
#: the external scaling API lists the applications and patches one (an annotation)
_SCALE = (Access("list", _APPLICATIONS), Access("patch", _APPLICATIONS))
_DELETE = (
    Access("delete", _INSTANCES),
    Access("list", _APPLICATIONS),
    Access("delete", _APPLICATIONS),
)
#: ``serve.run`` starts the serving layer when none runs, lists the applications (route
#: prefixes) and creates or patches one (its pickled graph goes into a Secret the operator
#: writes, owned by that application: the right to run code is the right to write it)
_IMPERATIVE_PUT = (
    *_READ,
    Access("create", _INSTANCES),
    Access("patch", _INSTANCES),
    Access("create", _APPLICATIONS),
    Access("patch", _APPLICATIONS),
)
_APPLICATION_DELETE = (Access("list", _APPLICATIONS), Access("delete", _APPLICATIONS))


def required_access(method: str, path: str) -> tuple[Access, ...] | None:
    """What a request needs: ``None`` for an open path, ``()`` for "authenticated, nothing
    more" (``/api/ray/version``, unknown paths: their 404 tells nothing), else the accesses.

    The accesses are those the Kubernetes backend makes for the request: a GET reads the instance
    and lists applications (``deployments/status`` also starts the serving layer: ``create``); a
    PUT creates or patches the instance and creates, patches and deletes applications; a DELETE
    deletes the instance and its applications; the external scaling POST lists and patches
    applications; ``serve.run``'s PUT of one application reads, creates or patches the instance
    and lists, creates or patches applications, and its DELETE lists and deletes them.
    """
    if path in OPEN_PATHS:
        return None
    path = path.rstrip("/")
    if _SCALE_PATH.fullmatch(path):
        return _SCALE if method == "POST" else ()
    if _APPLICATION_PATH.fullmatch(path):
        return {"PUT": _IMPERATIVE_PUT, "DELETE": _APPLICATION_DELETE}.get(method, ())
    if path == _STATUS_PATH:
        return (*_READ, Access("create", _INSTANCES)) if method in ("GET", "HEAD") else ()
    if path not in _CONFIG_PATHS:
        return ()
    if method in ("GET", "HEAD"):
        return _READ
    if method == "PUT":
        return _WRITE
    if method == "DELETE":
        return _DELETE
    return ()


@dataclass(frozen=True)
class _User:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]

    def review_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            spec["uid"] = self.uid
        if self.extra:
            spec["extra"] = {key: list(values) for key, values in self.extra}
        return spec


class _TtlCache:
    """A small map whose entries expire; bounded (the oldest half goes when it is full)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self._ttl_s, self._clock = ttl_s, clock
        self._entries: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> tuple[bool, Any]:
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock():
            self._entries.pop(key, None)
            return False, None
        return True, entry[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._entries) >= _MAX_ENTRIES:
            now = self._clock()
            live = [(k, e) for k, e in self._entries.items() if e[0] > now]
            self._entries = dict(live[len(live) // 2 :])
        self._entries[key] = (self._clock() + self._ttl_s, value)


def _error(status: int, message: str, **headers: str) -> web.Response:
    """The admin API's error body (``kubeserve.api.errors`` spells the same shape)."""
    return web.json_response({"error": message, "details": []}, status=status, headers=headers)


class KubernetesAuthorizer:
    """Authenticates and authorises admin API requests against the API server (see the module
    docstring); :attr:`middleware` goes into the admin app. Owns its caches only."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        ttl_s: float = DECISION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube, self._namespace = kube, namespace
        self._users = _TtlCache(ttl_s, clock)
        self._decisions = _TtlCache(ttl_s, clock)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        needed = required_access(request.method, request.path)
        if needed is None:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self._unauthenticated(
                "send a Kubernetes bearer token: Authorization: Bearer ..."
            )
        try:
            user = await self._authenticate(token)
            if user is None:
                return self._unauthenticated("the Kubernetes API server did not accept the token")
            missing = await self._missing(user, needed)
        except KubeError as exc:
            log.warning("access review failed: %s", exc)
            return _error(503, "cannot verify the caller with the Kubernetes API server; retry")
        if missing:
            wanted = ", ".join(str(access) for access in missing)
            return _error(
                403,
                f'forbidden: user "{user.username}" may not {wanted} in namespace '
                f'"{self._namespace}" ({request.method} {request.path} needs it)',
            )
        return await handler(request)

    @staticmethod
    def _unauthenticated(message: str) -> web.Response:
        return _error(401, message, **{"WWW-Authenticate": 'Bearer realm="kubeserve"'})

    async def _authenticate(self, token: str) -> _User | None:
        key = hashlib.sha256(token.encode()).digest()
        found, cached = self._users.get(key)
        if found:
            return cast(_User | None, cached)
        review = await self._kube.create(
            "TokenReview",
            None,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = (review or {}).get("status") or {}
        user: _User | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            extra = tuple(sorted((k, tuple(v)) for k, v in (info.get("extra") or {}).items()))
            user = _User(
                username=str(info.get("username", "")),
                uid=str(info.get("uid", "")),
                groups=tuple(info.get("groups") or ()),
                extra=extra,
            )
        self._users.put(key, user)
        return user

    async def _missing(self, user: _User, needed: tuple[Access, ...]) -> list[Access]:
        allowed = await asyncio.gather(*(self._allowed(user, access) for access in needed))
        return sorted(access for access, ok in zip(needed, allowed, strict=True) if not ok)

    async def _allowed(self, user: _User, access: Access) -> bool:
        key = (user, access)
        found, decision = self._decisions.get(key)
        if found:
            return bool(decision)
        attributes = {
            "namespace": self._namespace,
            "verb": access.verb,
            "group": GROUP,
            "resource": access.resource,
        }
        review = await self._kube.create(
            "SubjectAccessReview",
            None,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {**user.review_spec(), "resourceAttributes": attributes},
            },
        )
        decision = bool(((review or {}).get("status") or {}).get("allowed"))
        self._decisions.put(key, decision)
        return decision
