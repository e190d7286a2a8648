"""Custom request routers: Ray Serve 2.60's ``ray.serve.request_router`` API.

A deployment names a subclass of :class:`RequestRouter` in
``request_router_config.request_router_class``; every caller of the deployment (the proxies for
HTTP, the handle clients for composition) then asks an instance of it which replicas a request
may go to (:meth:`RequestRouter.choose_replicas`), and sends the request to the least loaded
replica with a free slot among the first rank that has one, as Ray does. The runtime side (who
loads the class, the retry loop, routing stats) is :mod:`kubeserve.runtime.custom_router`.

The names and attributes are Ray's where kubeserve has the thing they describe: a
:class:`RunningReplica` has ``replica_id``, ``node_id``, ``availability_zone``,
``multiplexed_model_ids``, ``max_ongoing_requests``, ``routing_stats`` (what the replica's
``record_routing_stats`` returned last) and ``replica_metadata``; the mixins offer Ray's helpers.
What has no meaning without Ray's actors (actor handles, queue-length probes over RPC) is absent:
the router's own in-flight count of each replica stands in for Ray's queue-length cache
(:meth:`RequestRouter.select_available_replicas`).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kubeserve.sdk.context import DeploymentID, ReplicaID

__all__ = [
    "FIFOMixin",
    "LocalityMixin",
    "MultiplexMixin",
    "PendingRequest",
    "ReplicaID",
    "ReplicaResult",
    "RequestMetadata",
    "RequestRouter",
    "RunningReplica",
]


@dataclass
class RequestMetadata:
    """What a router may know of a request besides its arguments (Ray's fields)."""

    request_id: str = ""
    internal_request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    call_method: str = "__call__"
    multiplexed_model_id: str = ""
    is_streaming: bool = False
    route: str = ""
    app_name: str = ""


@dataclass
class RequestRoutingContext:
    """Per-request state of the mixins' helpers across routing attempts (Ray's)."""

    multiplexed_start_matching_time: float | None = None
    tried_fewest_multiplexed_models: bool = False
    tried_first_multiplexed_models: bool = False
    tried_same_node: bool = False
    tried_same_az: bool = False
    should_backoff: bool = False


@dataclass
class PendingRequest:
    """A request waiting for a replica. ``args``/``kwargs`` are a handle call's arguments; a
    request through the HTTP proxy has none (its body is streamed to the replica, never held)."""

    args: list[Any]
    kwargs: dict[Any, Any]
    metadata: RequestMetadata
    created_at: float = field(default_factory=time.time)
    #: Ray's: set when the request is routed; kubeserve's callers wait on their own futures and
    #: leave it pending (made on first use, so a request needs no event loop to exist)
    future: asyncio.Future[Any] | None = None
    routing_context: RequestRoutingContext = field(default_factory=RequestRoutingContext)
    resolved: bool = True

    def reset_future(self) -> None:
        self.future = asyncio.get_running_loop().create_future()


class ReplicaResult:
    """What :meth:`RequestRouter.on_request_routed` is given about the routed request: kubeserve
    sends it as soon as the choice is made, so this names the request and its replica."""

    def __init__(self, metadata: RequestMetadata, replica_id: ReplicaID) -> None:
        self.metadata = metadata
        self.replica_id = replica_id


class RunningReplica:
    """One running replica of the deployment, as a router sees it (read-only for the router).

    The caller updates ``routing_stats`` (polled from the replica's ``record_routing_stats``)
    and ``multiplexed_model_ids`` (learnt from the replica's answers) in place.
    """

    def __init__(
        self,
        replica_id: ReplicaID,
        *,
        host: str,
        port: int,
        max_ongoing_requests: int,
        node_id: str = "",
        availability_zone: str | None = None,
    ) -> None:
        self._replica_id = replica_id
        self._host = host
        self._port = port
        self._max_ongoing_requests = max_ongoing_requests
        self._node_id = node_id
        self._availability_zone = availability_zone
        self._multiplexed_model_ids: set[str] = set()
        self._routing_stats: dict[str, Any] = {}
        #: the caller's requests in flight on the replica (kept by the caller)
        self._in_flight = 0

    @property
    def replica_id(self) -> ReplicaID:
        return self._replica_id

    @property
    def node_id(self) -> str:
        """The machine the replica runs on (its host address)."""
        return self._node_id

    @property
    def availability_zone(self) -> str | None:
        return self._availability_zone

    @property
    def multiplexed_model_ids(self) -> set[str]:
        return self._multiplexed_model_ids

    @property
    def routing_stats(self) -> dict[str, Any]:
        """What the replica's ``record_routing_stats()`` returned last ({} before that)."""
        return self._routing_stats

    @property
    def replica_metadata(self) -> dict[str, Any]:
        return {}

    @property
    def max_ongoing_requests(self) -> int:
        return self._max_ongoing_requests

    @property
    def is_cross_language(self) -> bool:
        return False

    @property
    def backend_http_endpoint(self) -> tuple[str, int] | None:
        return (self._host, self._port)

    def __repr__(self) -> str:
        return f"RunningReplica({self._replica_id.unique_id!r})"


class RequestRouter(ABC):
    """Chooses replicas for requests to one deployment; subclass it and implement
    :meth:`choose_replicas`.

    One instance per deployment per caller process, driven from that process's event loop.
    ``initialize_state`` is called once with ``request_router_kwargs`` after construction.
    """

    def __init__(
        self,
        deployment_id: DeploymentID,
        handle_source: Any = None,
        self_actor_id: str | None = None,
        self_actor_handle: Any = None,
        use_replica_queue_len_cache: bool = False,
        get_curr_time_s: Any = None,
        create_replica_wrapper_func: Any = None,
        initial_backoff_s: float = 0.025,
        backoff_multiplier: float = 2.0,
        max_backoff_s: float = 0.5,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._deployment_id = deployment_id
        self._handle_source = handle_source
        self.initial_backoff_s = initial_backoff_s
        self.backoff_multiplier = backoff_multiplier
        self.max_backoff_s = max_backoff_s
        self._replicas: dict[ReplicaID, RunningReplica] = {}
        self._replica_id_set: set[ReplicaID] = set()
        self._replicas_list: list[RunningReplica] = []

    def initialize_state(self, **kwargs: Any) -> None:  # noqa: B027 (optional hook)
        """Called once with the deployment's ``request_router_kwargs``."""

    @abstractmethod
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Replicas the request may go to, best rank first: the request goes to the least
        loaded replica with a free slot of the first rank that has one; when none has, this is
        asked again (after a backoff, or as soon as a slot frees)."""

    def on_request_routed(  # noqa: B027 (optional hook)
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        """Called once the request was given its replica."""

    def on_request_completed(  # noqa: B027 (optional hook)
        self, replica_id: ReplicaID, internal_request_id: str
    ) -> None:
        """Ray calls it when a routed request ended; kubeserve does not (yet): a caller's end of
        a request is on the path every request takes, which stays free of custom-router work."""

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Drop a replica that left the deployment."""
        self._replicas.pop(replica_id, None)
        self._replicas_list = list(self._replicas.values())
        self._replica_id_set.discard(replica_id)
        for hook in ("_discard_colocated_replica_ids", "_discard_multiplexed_replica_ids"):
            discard = getattr(self, hook, None)
            if discard is not None:
                discard(replica_id)

    def on_replica_actor_unavailable(self, replica_id: ReplicaID) -> None:  # noqa: B027
        """Ray invalidates a queue-length cache entry here; kubeserve keeps none."""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """The deployment's running replicas are now ``replicas``."""
        for hook in ("_update_colocated_replica_ids_with_replicas", "_update_multiplexed_ids"):
            update = getattr(self, hook, None)
            if update is not None:
                update(replicas)
        self._replicas = {r.replica_id: r for r in replicas}
        self._replica_id_set = set(self._replicas)
        self._replicas_list = list(replicas)

    def select_available_replicas(
        self, candidates: list[RunningReplica] | None = None
    ) -> list[RunningReplica]:
        """Those of ``candidates`` (default: every replica) with a free slot."""
        pool = self._replicas_list if candidates is None else candidates
        return [r for r in pool if r._in_flight < r.max_ongoing_requests]

    @property
    def curr_replicas(self) -> dict[ReplicaID, RunningReplica]:
        return self._replicas

    @property
    def app_name(self) -> str:
        return self._deployment_id.app_name

    @property
    def supports_rejection_protocol(self) -> bool:
        return True


class LocalityMixin:
    """Ray's locality helpers: prefer replicas on the caller's node, then its zone."""

    def __init__(
        self,
        self_node_id: str | None = None,
        prefer_local_node_routing: bool = False,
        prefer_local_az_routing: bool = False,
        self_availability_zone: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._self_node_id = self_node_id
        self._prefer_local_node_routing = prefer_local_node_routing
        self._prefer_local_az_routing = prefer_local_az_routing
        self._self_availability_zone = self_availability_zone
        self._colocated_node: set[ReplicaID] = set()
        self._colocated_az: set[ReplicaID] = set()
        self._replica_id_set: set[ReplicaID] = set()

    def _discard_colocated_replica_ids(self, replica_id: ReplicaID) -> None:
        self._colocated_node.discard(replica_id)
        self._colocated_az.discard(replica_id)

    def _update_colocated_replica_ids_with_replicas(self, replicas: list[RunningReplica]) -> None:
        node, zone = self._self_node_id, self._self_availability_zone
        self._colocated_node = {r.replica_id for r in replicas if node and r.node_id == node}
        self._colocated_az = {
            r.replica_id for r in replicas if zone and r.availability_zone == zone
        }

    def apply_locality_routing(
        self, pending_request: PendingRequest | None = None
    ) -> set[ReplicaID]:
        """Candidate ids: the caller's node first, then its zone, then every replica."""
        if pending_request is None:
            return self._replica_id_set
        routing = pending_request.routing_context
        if self._prefer_local_node_routing and not routing.tried_same_node and self._colocated_node:
            routing.tried_same_node, routing.should_backoff = True, False
            return self._colocated_node
        if self._prefer_local_az_routing and not routing.tried_same_az and self._colocated_az:
            routing.tried_same_az, routing.should_backoff = True, False
            return self._colocated_az
        routing.should_backoff = True
        return self._replica_id_set

    def rank_replicas_via_locality(
        self, replicas: list[RunningReplica]
    ) -> list[list[RunningReplica]]:
        """Three ranks: on the caller's node, in its zone, the others."""
        ranked: list[list[RunningReplica]] = [[], [], []]
        for replica in replicas:
            if replica.replica_id in self._colocated_node:
                ranked[0].append(replica)
            elif replica.replica_id in self._colocated_az:
                ranked[1].append(replica)
            else:
                ranked[2].append(replica)
        return ranked


#: How long a multiplexed request prefers replicas holding its model (Ray's default).
MULTIPLEXED_MATCHING_TIMEOUT_S = 1.0


class MultiplexMixin:
    """Ray's multiplexing helpers: prefer replicas holding the request's model, then those
    holding the fewest models."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._model_replica_ids: defaultdict[str, set[ReplicaID]] = defaultdict(set)
        self._replica_id_set: set[ReplicaID] = set()
        self._replicas: dict[ReplicaID, RunningReplica] = {}

    def _discard_multiplexed_replica_ids(self, replica_id: ReplicaID) -> None:
        for ids in self._model_replica_ids.values():
            ids.discard(replica_id)

    def _update_multiplexed_ids(self, replicas: list[RunningReplica]) -> None:
        index: defaultdict[str, set[ReplicaID]] = defaultdict(set)
        for replica in replicas:
            for model_id in replica.multiplexed_model_ids:
                index[model_id].add(replica.replica_id)
        self._model_replica_ids = index

    def _get_replica_ids_with_fewest_multiplexed_models(self) -> set[ReplicaID]:
        fewest = min((len(r.multiplexed_model_ids) for r in self._replicas.values()), default=0)
        return {
            r.replica_id for r in self._replicas.values() if len(r.multiplexed_model_ids) == fewest
        }

    def apply_multiplex_routing(
        self, pending_request: PendingRequest | None = None
    ) -> set[ReplicaID]:
        """Candidate ids: holders of the model for a while, then the fewest-models replicas
        once, then every replica."""
        if pending_request is None:
            return self._replica_id_set
        routing = pending_request.routing_context
        if routing.multiplexed_start_matching_time is None:
            routing.multiplexed_start_matching_time = time.time()
        model_id = pending_request.metadata.multiplexed_model_id
        routing.should_backoff = True
        waited = time.time() - routing.multiplexed_start_matching_time
        if waited < MULTIPLEXED_MATCHING_TIMEOUT_S:
            holders = self._model_replica_ids.get(model_id, set())
            if holders and not routing.tried_first_multiplexed_models:
                routing.tried_first_multiplexed_models = True
                return holders
            routing.tried_first_multiplexed_models = True
            return self._get_replica_ids_with_fewest_multiplexed_models()
        if not routing.tried_fewest_multiplexed_models:
            routing.tried_fewest_multiplexed_models = True
            return self._get_replica_ids_with_fewest_multiplexed_models()
        return self._replica_id_set

    def rank_replicas_via_multiplex(
        self, replicas: list[RunningReplica], multiplexed_model_id: str
    ) -> list[list[RunningReplica]]:
        """Three ranks: holders of the model, replicas with the fewest models, the others."""
        holders = self._model_replica_ids.get(multiplexed_model_id, set())
        fewest = self._get_replica_ids_with_fewest_multiplexed_models()
        ranked: list[list[RunningReplica]] = [[], [], []]
        for replica in replicas:
            if replica.replica_id in holders:
                ranked[0].append(replica)
            elif replica.replica_id in fewest:
                ranked[1].append(replica)
            else:
                ranked[2].append(replica)
        return ranked


class FIFOMixin:
    """Ray's FIFO mixin: requests get replicas in arrival order. kubeserve's callers always
    hand freed slots to the oldest waiting request, so this only marks the intent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


def backoff_s(router: RequestRouter, attempt: int) -> float:
    """Ray's backoff before routing attempt ``attempt`` (0-based) once no replica had room."""
    try:
        delay = router.initial_backoff_s * router.backoff_multiplier**attempt
    except OverflowError:
        return router.max_backoff_s
    return min(delay, router.max_backoff_s) if math.isfinite(delay) else router.max_backoff_s
