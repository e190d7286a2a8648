"""Runs a deployment's custom ``RequestRouter`` (``request_router_config.request_router_class``)
in a caller: a proxy or a handle client. Only :mod:`kubeserve.runtime.router` uses it, and only
for deployments that name such a class; the built-in policy never touches this module.

Where the class is loaded, and why: a caller does not import the user's module itself. The proxy
runs without any application's code (on ``kubeserve start`` it is one process for every
application, each with its own ``working_dir`` and ``py_modules``), and a handle client runs in a
replica of *another* deployment, whose code may differ. A replica of the routed deployment runs
with exactly the code and runtime_env the class was written for, so the caller asks it
(``GET /-/request-router/<path>``, a ``CONTROL`` request any caller holding the instance's secret
may make): the replica imports the class and answers it pickled by value (cloudpickle, the class
and its module's functions included, as Ray's build does before its proxies load it). The caller
unpickles it with ``ray`` resolving to kubeserve's compatibility package. The replica also loads
the class at start-up, so a class that fails to import fails the replica, and so the deploy
(``DEPLOY_FAILED`` naming the error), instead of failing requests later.

Per request (:meth:`CustomRouting.choose`): the router's ``choose_replicas`` ranks candidates;
the request goes to the least loaded replica with a free slot (``max_ongoing_requests``, counted
by this caller as for the built-in policy) in the first rank that has one; when no rank has, the
caller waits for a slot to free or Ray's backoff (``initial_backoff_s`` doubling by
``backoff_multiplier`` up to ``max_backoff_s``) and asks again.

Routing stats: while a router runs, this caller polls ``GET /-/routing-stats`` (the deployment's
``record_routing_stats()``) on every replica each ``request_routing_stats_period_s``, each poll
limited to ``request_routing_stats_timeout_s``, and the router reads the last answer as
``replica.routing_stats``. Ray's controller polls once and broadcasts; here each caller polls for
itself, which works alike on both backends, at the cost of one small request per caller and
replica and period. A deployment without the method answers 404 and is not polled again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import socket
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubeserve.runtime import channel, wire
from kubeserve.sdk import context, ray_namespace
from kubeserve.sdk.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestMetadata,
    RequestRouter,
    RunningReplica,
    backoff_s,
)

if TYPE_CHECKING:
    from kubeserve.runtime.router import RoutedReplica

__all__ = ["CustomRouting", "RouterUnavailable"]

log = logging.getLogger("kubeserve.router")

#: How long fetching the router class from a replica may take.
FETCH_TIMEOUT_S = 10.0
#: After a failed load, how long callers are refused before the caller tries again.
RETRY_LOAD_S = 5.0


#: The node id of this caller: its host name. A replica reached on a loopback address runs on
#: this machine (every replica of ``kubeserve start``); another one's node id is its address (on
#: Kubernetes the data plane knows no node names yet, so no replica counts as colocated there).
THIS_NODE = socket.gethostname()


def _node_of(host: str) -> str:
    return THIS_NODE if host in ("127.0.0.1", "::1", "localhost") else host


class RouterUnavailable(Exception):
    """The deployment's router class could not be loaded in this caller."""


class CustomRouting:
    """One deployment's custom router in this caller: the class, its replicas' views, the
    routing-stats poller.

    Owned by the router's pool of the deployment, driven from its event loop. ``replicas`` of
    :meth:`update` are the pool's; :attr:`views` maps each to the :class:`RunningReplica` the
    user's router sees (kept across updates, so its stats and models survive).
    """

    def __init__(self, key: str, spec: wire.RequestRouterSpec, secret: bytes | None) -> None:
        self.key = key
        self.spec = spec
        self._secret = secret
        app, deployment = wire.split_deployment_key(key)
        self._deployment_id = context.DeploymentID(deployment, app)
        self.router: RequestRouter | None = None
        self._loading: asyncio.Future[RequestRouter] | None = None
        self._failed_at = 0.0
        self._error = ""
        self.views: dict[str, RunningReplica] = {}
        self._routed: dict[str, RoutedReplica] = {}
        self._stats_task: asyncio.Task[None] | None = None

    # -- replicas ---------------------------------------------------------------------------------

    def update(self, replicas: list[RoutedReplica], max_ongoing: int) -> None:
        """The deployment's replicas are now ``replicas``; the router is told."""
        views: dict[str, RunningReplica] = {}
        for r in replicas:
            view = self.views.get(r.replica_id)
            if view is None or view.max_ongoing_requests != max_ongoing:
                view = RunningReplica(
                    ReplicaID(r.replica_id, self._deployment_id),
                    host=r.host,
                    port=r.port,
                    max_ongoing_requests=max_ongoing,
                    node_id=_node_of(r.host),
                )
                old = self.views.get(r.replica_id)
                if old is not None:
                    view._routing_stats = old._routing_stats
            views[r.replica_id] = view
        gone = [v for rid, v in self.views.items() if rid not in views]
        self.views = views
        self._routed = {r.replica_id: r for r in replicas}
        if self.router is not None:
            for view in gone:
                self.router.on_replica_actor_died(view.replica_id)
            self.router.update_replicas(list(views.values()))

    def close(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            self._stats_task = None

    # -- requests ---------------------------------------------------------------------------------

    def pending_request(
        self, model_id: str, call: tuple[str, tuple[Any, ...], dict[str, Any]] | None
    ) -> PendingRequest:
        method, args, kwargs = call if call is not None else ("__call__", (), {})
        current = context.request_context.get()
        metadata = RequestMetadata(
            request_id=current.request_id if current is not None else "",
            call_method=method,
            multiplexed_model_id=model_id,
            app_name=self._deployment_id.app_name,
        )
        return PendingRequest(list(args), dict(kwargs), metadata)

    async def choose(
        self, replicas: list[RoutedReplica], pending: PendingRequest, avoid: RoutedReplica | None
    ) -> RoutedReplica | None:
        """A replica of ``replicas`` with a free slot that the router ranks first, or None when
        none of those it chose has room (``avoid`` only when no other one has). Raises
        :class:`RouterUnavailable` when the class cannot be loaded."""
        router = self.router or await self._load(replicas)
        views = self.views
        for r in replicas:
            view = views.get(r.replica_id)
            if view is not None:
                view._in_flight = r.in_flight
                if len(view._multiplexed_model_ids) != len(r.models):
                    view._multiplexed_model_ids = set(r.models)
        ranks = await router.choose_replicas(list(views.values()), pending)
        fallback: RoutedReplica | None = None
        for rank in ranks:
            best: RoutedReplica | None = None
            for view in rank:
                routed = self._routed.get(view.replica_id.unique_id)
                if routed is None or routed.in_flight >= view.max_ongoing_requests:
                    continue
                if routed is avoid:
                    fallback = routed
                elif best is None or routed.in_flight < best.in_flight:
                    best = routed
            if best is not None:
                return best
        return fallback

    def routed(self, pending: PendingRequest, replica: RoutedReplica) -> None:
        """Tell the router where the request went."""
        if self.router is None:
            return
        view = self.views.get(replica.replica_id)
        replica_id = view.replica_id if view else ReplicaID(replica.replica_id, self._deployment_id)
        try:
            self.router.on_request_routed(
                pending, replica_id, ReplicaResult(pending.metadata, replica_id)
            )
        except Exception:
            log.exception("%s: on_request_routed of the custom router failed", self.key)

    def backoff_s(self, attempt: int) -> float:
        return (
            backoff_s(self.router, attempt)
            if self.router is not None
            else self.spec["max_backoff_s"]
        )

    # -- loading the class ------------------------------------------------------------------------

    async def _load(self, replicas: list[RoutedReplica]) -> RequestRouter:
        """The router instance, loading its class from a replica the first time; concurrent
        callers share one load."""
        if self._error and time.monotonic() - self._failed_at < RETRY_LOAD_S:
            raise RouterUnavailable(self._error)
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._fetch(list(replicas)))
        loading = self._loading
        try:
            router = await asyncio.shield(loading)
        except RouterUnavailable as exc:
            if self._loading is loading:
                self._loading = None
                self._error, self._failed_at = str(exc), time.monotonic()
            raise
        if self.router is None:
            self.router = router
            router.update_replicas(list(self.views.values()))
            self._stats_task = asyncio.get_running_loop().create_task(self._poll_stats())
        return self.router

    async def _fetch(self, replicas: list[RoutedReplica]) -> RequestRouter:
        path = self.spec["request_router_class"]
        errors = []
        for replica in replicas[:3]:
            try:
                status, body = await channel.request(
                    replica.host,
                    replica.port,
                    "GET",
                    wire.REQUEST_ROUTER_PREFIX + quote(path, safe=""),
                    self._secret or b"",
                    replica.replica_id,
                    timeout_s=FETCH_TIMEOUT_S,
                )
            except (OSError, TimeoutError) as exc:
                errors.append(f"replica {replica.replica_id}: {exc or type(exc).__name__}")
                continue
            if status != 200:
                raise RouterUnavailable(self._why(body.decode("utf-8", "replace")))
            return self._instantiate(body)
        raise RouterUnavailable(self._why("; ".join(errors) or "no replica to load it from"))

    def _instantiate(self, pickled: bytes) -> RequestRouter:
        try:
            ray_namespace.install()  # the class's module may refer to ``ray``
            cls = pickle.loads(pickled)
            if not (isinstance(cls, type) and issubclass(cls, RequestRouter)):
                raise TypeError(
                    f"{cls!r} is not a subclass of ray.serve.request_router.RequestRouter"
                )
            spec = self.spec
            router = cls(
                deployment_id=self._deployment_id,
                handle_source=None,
                self_node_id=THIS_NODE,
                initial_backoff_s=spec["initial_backoff_s"],
                backoff_multiplier=spec["backoff_multiplier"],
                max_backoff_s=spec["max_backoff_s"],
            )
            router.initialize_state(**spec["request_router_kwargs"])
        except Exception as exc:
            raise RouterUnavailable(self._why(f"{type(exc).__name__}: {exc}")) from exc
        log.info("%s: routing with %s", self.key, spec["request_router_class"])
        return router

    def _why(self, error: str) -> str:
        return (
            f"the request router {self.spec['request_router_class']!r} of {self.key} could not be "
            f"loaded: {error}"
        )

    # -- routing stats ----------------------------------------------------------------------------

    async def _poll_stats(self) -> None:
        period = self.spec["request_routing_stats_period_s"]
        while True:
            views = list(self.views.items())
            answers = await asyncio.gather(*(self._stats_of(rid) for rid, _ in views))
            if any(a is False for a in answers):
                return  # the deployment has no record_routing_stats: nothing to poll
            for (_, view), stats in zip(views, answers, strict=True):
                if isinstance(stats, dict):
                    view._routing_stats = stats
            await asyncio.sleep(period)

    async def _stats_of(self, replica_id: str) -> dict[str, Any] | bool | None:
        """The replica's stats; False when the deployment has none; None when this poll
        failed (the last stats stay)."""
        routed = self._routed.get(replica_id)
        if routed is None:
            return None
        try:
            status, body = await channel.request(
                routed.host,
                routed.port,
                "GET",
                wire.ROUTING_STATS_PATH,
                self._secret or b"",
                replica_id,
                timeout_s=self.spec["request_routing_stats_timeout_s"],
            )
        except (OSError, TimeoutError) as exc:
            log.debug("%s: routing stats of %s: %s", self.key, replica_id, exc)
            return None
        if status == 404:
            return False
        if status != 200:
            log.warning(
                "%s: record_routing_stats of %s failed: %s", self.key, replica_id, body[:300]
            )
            return None
        try:
            stats = json.loads(body)
        except ValueError:
            return None
        return stats if isinstance(stats, dict) else None
