"""The seam between the admin API and where desired state lives.

Both backends (local: SQLite + child processes; kubernetes: custom resources + pods) implement
:class:`Backend`. The API validates every body before calling it, so a backend receives only configs
that match the schema, as JSON-ready dicts holding exactly the fields the client set.

Invariants every backend keeps:

* :meth:`Backend.apply` is declarative and idempotent: it stores the complete desired state in one
  step (applications it does not list are removed) and returns once the state is durable; the
  reconciliation happens afterwards.
* :meth:`Backend.shutdown` is a no-op when nothing runs.
* Nothing already accepted is lost when :meth:`Backend.apply` raises.
* Two ways to deploy, as in Ray 2.60: :meth:`Backend.apply` is the declarative one (it removes the
  declarative applications it does not list and keeps the imperative ones);
  :meth:`Backend.apply_imperative` (``serve.run``) adds or replaces one application, whose graph
  is the driver's pickled application object instead of an ``import_path``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from kubeserve.schema.errors import ErrorDetail
from kubeserve.schema.status import ServeInstanceDetails


class BackendError(Exception):
    """Base of the errors a backend reports to the API."""


class ConflictError(BackendError):
    """The request contradicts the running state (HTTP 409)."""


class NotFoundError(BackendError):
    """The requested object does not exist (HTTP 404)."""


class PayloadTooLargeError(BackendError):
    """What the request carries exceeds what this backend can store (HTTP 413); nothing was
    changed, and the message names the limit."""


class PreconditionFailedError(BackendError):
    """The request is valid but the target's state does not allow it (HTTP 412), as Ray answers
    an external scaling request for an application without ``external_scaler_enabled``."""


class RejectedError(BackendError):
    """The store of desired state refused a config the API accepted (HTTP 400); for example a
    Kubernetes API server whose CRD rules are stricter than the installed kubeserve's schema."""


class UnavailableError(BackendError):
    """The store of desired state cannot be reached or refused to work (HTTP 503); nothing was
    changed by the failed step, and the request can be retried."""


class InsufficientStorageError(BackendError):
    """The store of desired state could not be written: its disk is full (HTTP 507). Nothing
    was changed by the failed step; the message names where, and the request can be sent again
    once there is room."""


class Backend(Protocol):
    async def start(self) -> None:
        """Start background work (controller loops); called once before serving the API."""
        ...

    async def close(self) -> None:
        """Stop background work; the data plane of the local backend stops with it."""
        ...

    async def apply(
        self,
        instance: dict[str, Any],
        applications: list[dict[str, Any]],
        *,
        single_app: dict[str, Any] | None = None,
    ) -> None:
        """Make ``instance`` options and ``applications`` the complete desired state.

        ``single_app`` is the body of a single-application PUT, kept verbatim for its GET.
        Raises :class:`ConflictError` when ``instance`` changes the host or port of a running
        serving layer.
        """
        ...

    async def apply_imperative(
        self, instance: dict[str, Any], config: dict[str, Any], graph: bytes
    ) -> None:
        """Deploy one application imperatively (``serve.run``): ``config`` holds its ``name``,
        ``route_prefix``, what else serve.run was given and the digest of ``graph`` (see
        :mod:`kubeserve.schema.imperative`); ``graph`` is the pickled application. Another
        application of that name (of either kind) is replaced; the others keep running.
        ``instance`` holds the options of a serving layer started by this call.

        Raises :class:`ConflictError` when another application serves ``route_prefix`` (Ray's
        "Prefix ... is being used by application ..."), :class:`RejectedError` where the
        backend cannot run imperative applications.
        """
        ...

    async def delete_application(self, name: str) -> None:
        """Remove application ``name``, of either kind (``serve.delete``); a no-op for an
        application that does not exist, as in Ray."""
        ...

    def refusals(self, app_config: dict[str, Any]) -> list[ErrorDetail]:
        """Why this backend cannot run an application config the schema accepts (empty: it can).

        Each detail's ``loc`` is relative to the application; the API prefixes it with the
        application's place in the body, so the 400 names the field as the client sent it.
        """
        ...

    def instance_refusals(self, instance: dict[str, Any]) -> list[ErrorDetail]:
        """Why this backend cannot run the serving layer's options (``http_options``...) the
        schema accepts, each at its field's path in the multi-application body (empty: it can)."""
        ...

    async def shutdown(self) -> None:
        """Remove the serving layer and every application; no-op when nothing runs."""
        ...

    async def ensure_running(self, instance: dict[str, Any]) -> None:
        """Start the serving layer with ``instance`` options and no applications, if not running."""
        ...

    async def single_app_config(self) -> dict[str, Any] | None:
        """The body of the last single-application PUT, when that is what runs."""
        ...

    async def instance_details(self) -> ServeInstanceDetails:
        """What GET /api/serve/applications/ answers (built by
        :func:`kubeserve.control.details.instance_details`)."""
        ...

    async def scale_deployment(self, app: str, deployment: str, target_num_replicas: int) -> None:
        """Run ``target_num_replicas`` replicas of ``deployment`` (the external scaling API).

        Raises :class:`NotFoundError` when the application or deployment does not exist and
        :class:`PreconditionFailedError` when the application's ``external_scaler_enabled`` is
        not true. The count holds until the next one, or until the application is deployed with
        ``external_scaler_enabled`` off.
        """
        ...

    async def metrics(self) -> bytes | None:
        """The instance's Prometheus metrics (text exposition, Ray Serve's names), or ``None``
        where they are scraped elsewhere (on Kubernetes: from each proxy and replica pod)."""
        ...

    def internal_routes(self) -> list[web.RouteDef]:
        """Backend-specific routes on the admin server (e.g. the local discovery long-poll)."""
        ...


class Namespaces(Protocol):
    """The serving instances an admin server answers for, one per namespace: the bare paths mean
    :attr:`own`'s, ``/namespaces/<namespace>/...`` the named one's (see
    :mod:`kubeserve.schema.namespaces`). The names it is given are valid namespace names."""

    @property
    def own(self) -> str:
        """The namespace the bare paths address."""
        ...

    def backend(self, namespace: str) -> Backend:
        """The backend of ``namespace``'s instance (the same object for the same namespace, so
        its writes stay serialised); :class:`NotFoundError` saying why there is none."""
        ...

    def names(self) -> list[str]:
        """The namespaces served, sorted (the dashboard offers them)."""
        ...


class SingleNamespace:
    """One instance, whose namespace is ``own``: what ``kubeserve start`` serves. The bare paths
    and ``/namespaces/<own>/...`` address it; another namespace is a 404 saying so."""

    def __init__(self, backend: Backend, own: str = "default") -> None:
        self._backend, self._own = backend, own

    @property
    def own(self) -> str:
        return self._own

    def backend(self, namespace: str) -> Backend:
        if namespace != self._own:
            raise NotFoundError(
                f'no namespace "{namespace}" here: this server has one serving instance, '
                f'addressed by the bare paths (/api/...) or as namespace "{self._own}" '
                f"(/namespaces/{self._own}/api/...)"
            )
        return self._backend

    def names(self) -> list[str]:
        return [self._own]


#: Whether the caller of a request may read the instance of a namespace, set on the request by the
#: access control a backend brings (the operator's TokenReview and SubjectAccessReview); a
#: request without it comes from a caller who may read every namespace served.
ReadCheck = Callable[[str], Awaitable[bool]]
READ_CHECK_KEY: web.RequestKey[ReadCheck] = web.RequestKey("kubeserve_read_check")
