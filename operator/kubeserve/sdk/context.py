"""What user code can ask about where it runs: the replica, and the request being served.

The runtime sets these; the SDK (and the Ray compatibility layer's ``serve.get_replica_context()``
and ``serve.get_multiplexed_model_id()``) reads them. The replica context is process-wide (one
replica per process); the request context is a :class:`contextvars.ContextVar`, so concurrent
requests on one event loop each see their own.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "DeploymentID",
    "ReplicaContext",
    "ReplicaID",
    "RequestContext",
    "get_replica_context",
    "in_kubeserve_process",
    "mark_kubeserve_process",
    "request_context",
    "set_replica_context",
]


class DeploymentID(NamedTuple):
    name: str
    app_name: str


class ReplicaID(NamedTuple):
    unique_id: str
    deployment_id: DeploymentID


@dataclass
class ReplicaContext:
    """The replica this process serves (Ray's ``ReplicaContext`` surface)."""

    replica_id: ReplicaID
    servable_object: Any = None

    @property
    def app_name(self) -> str:
        return self.replica_id.deployment_id.app_name

    @property
    def deployment(self) -> str:
        return self.replica_id.deployment_id.name

    @property
    def replica_tag(self) -> str:
        return self.replica_id.unique_id


_replica: ReplicaContext | None = None


def set_replica_context(context: ReplicaContext | None) -> None:
    global _replica
    _replica = context


def get_replica_context() -> ReplicaContext | None:
    return _replica


_kubeserve_process = False


def mark_kubeserve_process() -> None:
    """Called by kubeserve's build and replica processes before they load user code: a
    ``serve.run`` in that code (a script's top level, say) then returns at once instead of
    deploying the application again and waiting for the build it runs in."""
    global _kubeserve_process
    _kubeserve_process = True


def in_kubeserve_process() -> bool:
    return _kubeserve_process


@dataclass(frozen=True)
class RequestContext:
    """The request being served: its id and the model a multiplexed call asked for."""

    request_id: str = ""
    multiplexed_model_id: str = ""
    route: str = ""


_new = object.__new__


def new_request_context(request_id: str, model_id: str, route: str) -> RequestContext:
    """``RequestContext(request_id, model_id, route)``, made without the frozen dataclass's
    ``__init__`` (three ``object.__setattr__`` calls: a replica makes one per request)."""
    made = _new(RequestContext)
    fields = made.__dict__
    fields["request_id"] = request_id
    fields["multiplexed_model_id"] = model_id
    fields["route"] = route
    return made


#: The request being served (None outside a request, or when it has nothing to tell).
request_context: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "kubeserve_request_context", default=None
)
