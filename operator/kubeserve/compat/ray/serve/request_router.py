"""``ray.serve.request_router``: Ray Serve 2.60's API for custom request routers, over kubeserve's
(:mod:`kubeserve.sdk.request_router`). A deployment names a subclass of :class:`RequestRouter` in
``request_router_config.request_router_class``; every proxy and handle calling it asks it which
replicas a request may go to.

``ReplicaResult`` is importable here as in Ray (whose module re-exports it outside ``__all__``).
"""

from __future__ import annotations

from kubeserve.sdk.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

__all__ = [
    "FIFOMixin",
    "LocalityMixin",
    "MultiplexMixin",
    "PendingRequest",
    "ReplicaID",
    "RequestRouter",
    "RunningReplica",
]

_ = ReplicaResult  # importable, not public: as in Ray
