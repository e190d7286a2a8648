"""Chooses the replica that runs a request, for proxies and for deployment handles.

Policy: power of two choices on in-flight counts; never more than
``max_ongoing_requests`` in flight on one replica; when every replica is full, callers wait in a
bounded FIFO queue until a slot frees or their timeout passes. A deployment with no replica and none
coming (discovery says why: its application failed to deploy) refuses callers at once.

Multiplexed models (``@serve.multiplexed``), as Ray Serve routes them: a request that names a model
(``model_id``) goes, among the replicas with a free slot, to

1. one that holds the model (the less loaded of two random holders);
2. else, when no holder is known or every holder is full, the replica with the fewest known
   models, ties broken by rendezvous hashing of (model, replica id): a deterministic choice, so
   that every caller (the proxies, each handle client) sends a new model to the same replica and
   concurrent first requests share one load instead of loading it everywhere;
3. else (no replica has a free slot) it waits in the FIFO queue like any request, and the slot it
   is handed is chosen by the same rules.

Who holds what is learnt from traffic, with no control-plane path: the answer of a replica to a
multiplexed request names the models it holds then (``wire.MODELS_HEADER``, read by the proxy's
upstream connections and the handle client), and :meth:`Router.note_models` keeps it per replica
(at most ``wire.MODELS_SHOWN`` ids), indexed by model. So it works alike on both backends, and a
caller's view is only as fresh as its own last answer from each replica: a model another caller
had evicted is loaded again where this caller expected it, and the answer corrects the view.
Unlike Ray, a request whose holders are all at ``max_ongoing_requests`` does not wait for one of
them (Ray waits up to a second): it takes the free slot rule 2 gives it at once.

Requests without a model id take the plain path: no lookup, no allocation more than before.

Custom routers (``request_router_config.request_router_class``, Ray's ``RequestRouter`` API): the
pool of such a deployment is a :class:`_CustomPool`, whose synchronous pick never succeeds, so
its requests take :meth:`Router.assign`'s slow path, where the user's router chooses
(:mod:`kubeserve.runtime.custom_router`, loaded only then). The built-in path is untouched: no
check on it tells the two apart beyond the method its pool's class already dispatches to.

Ownership: one :class:`Router` per process, driven from one event loop. The router owns the
in-flight count of every replica it hands out (:attr:`RoutedReplica.in_flight`); callers own a slot
between :meth:`Router.assign` and :meth:`Router.release` and must release each slot exactly once.
The set of replicas is owned by discovery, which replaces it wholesale with :meth:`Router.update`.

Replicas on their way out: a replica that refused a connection or answered that it is shutting
down is taken out of choice at once (:meth:`Router.retire`), for as long as discovery still lists
it, at most :data:`RETIRED_S`. Discovery lags behind a replica's stop (on Kubernetes, the
EndpointSlice reaches every proxy some time after the kubelet signals the pod): without this, a
caller would keep choosing replicas that turn it away, and fail once its attempts ran out while
the replicas that will serve it are starting. With it, the request goes to another replica, or
waits in the queue for one, as when no replica runs at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kubeserve.runtime.wire import (
    UNAVAILABLE_RETRY_AFTER_S,
    DeploymentEndpoints,
    RequestRouterSpec,
    decode_models,
)

if TYPE_CHECKING:
    from kubeserve.runtime.custom_router import CustomRouting

#: What a handle call tells a custom router about itself: (method, args, kwargs).
CallInfo = tuple[str, tuple[Any, ...], dict[str, Any]]

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "BackPressure",
    "DeploymentUnavailable",
    "NoReplicaAvailable",
    "RoutedReplica",
    "Router",
]

#: Callers allowed to wait for a slot per deployment; beyond that, :meth:`Router.assign` rejects.
DEFAULT_MAX_QUEUED = 1000
#: How long a replica :meth:`Router.retire` took out stays out while discovery still lists it: ample
#: for discovery to learn that it stops, short enough that one that turned a caller away once
#: (its container restarted in place) is chosen again.
RETIRED_S = 10.0

#: A replica as discovery names it: (replica id, host, port)
_ReplicaKey = tuple[str, str, int]


class NoReplicaAvailable(Exception):
    """No replica could take the request: none running, the queue is full, or the wait timed out."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"no replica available for {key}: {reason}")
        self.key = key
        self.reason = reason


class BackPressure(NoReplicaAvailable):
    """The deployment's queue at this caller is full (``max_queued_requests``): refused at once,
    with the HTTP answer its ``backpressure_config`` asks for."""

    def __init__(
        self, key: str, reason: str, status: int = 503, retry_after_s: float | None = None
    ) -> None:
        super().__init__(key, reason)
        self.status = status
        self.retry_after_s = retry_after_s


class DeploymentUnavailable(NoReplicaAvailable):
    """No replica of the deployment runs and none is coming (its application failed to deploy,
    :func:`~kubeserve.runtime.wire.no_replica_coming`): refused at once, 503 with a
    ``Retry-After``, rather than left waiting until the caller gives up."""

    status = 503
    retry_after_s = UNAVAILABLE_RETRY_AFTER_S


class RoutedReplica:
    """One running replica and the requests the router has in flight on it.

    A ``RoutedReplica`` is the slot handle callers get from :meth:`Router.assign`. It stays valid
    after an update removes the replica: releasing it then only decrements a count nobody reads.
    """

    __slots__ = (
        "_pool",
        "external",
        "host",
        "in_flight",
        "models",
        "models_raw",
        "port",
        "replica_id",
    )

    def __init__(self, replica_id: str, host: str, port: int, pool: _Pool) -> None:
        self.replica_id = replica_id
        self.host = host
        self.port = port
        self.in_flight = 0
        #: the part of ``in_flight`` another process in front of the same replicas has in flight
        #: (:meth:`Router.set_external`)
        self.external = 0
        self._pool = pool
        #: the multiplexed models the replica said it holds in its last answer to this process,
        #: and that answer's header value as received
        self.models: frozenset[str] = frozenset()
        self.models_raw = b""

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}"
        return f"RoutedReplica({self.replica_id!r}, {where}, in_flight={self.in_flight})"


class _Pool:
    """The replicas of one deployment and the callers queued for them.

    Invariants: ``0 <= r.in_flight <= max_ongoing`` for every replica in ``replicas`` (a slot is
    counted the moment it is handed out, including hand-offs to queued waiters), but for
    ``r.external``, which the other process fills on its own (the sum may pass the cap while
    neither has seen the other's last requests); ``waiters`` only
    holds futures that are pending, in arrival order; ``holders[m]`` lists exactly the replicas of
    ``replicas`` whose ``models`` hold ``m`` (no empty lists); ``waiting_models`` maps the waiters
    that named a model to it.
    """

    __slots__ = (
        "backpressure",
        "holders",
        "key",
        "max_ongoing",
        "max_queued",
        "replicas",
        "unavailable",
        "waiters",
        "waiting_models",
    )

    #: the deployment's custom router (:class:`_CustomPool` only)
    custom: CustomRouting | None = None

    def __init__(self, key: str, max_queued: int) -> None:
        self.key = key
        self.max_ongoing = 1
        self.max_queued = max_queued
        #: the answer beyond ``max_queued``: HTTP status and Retry-After seconds
        self.backpressure: tuple[int, float | None] = (503, None)
        #: why no replica is coming ("" when one may: callers wait for it)
        self.unavailable = ""
        self.replicas: list[RoutedReplica] = []
        self.waiters: deque[asyncio.Future[RoutedReplica]] = deque()
        self.holders: dict[str, list[RoutedReplica]] = {}
        self.waiting_models: dict[asyncio.Future[RoutedReplica], str] = {}

    def pick(self, avoid: RoutedReplica | None) -> RoutedReplica | None:
        """A replica with a free slot, or ``None``: two random choices, the less loaded wins
        (:func:`_two_choices`). ``avoid`` is best effort: it is returned only when it is the one
        replica with room.
        """
        replicas = self.replicas
        n = len(replicas)
        if n == 0:
            return None
        cap = self.max_ongoing
        if n == 1:
            only = replicas[0]
            return only if only.in_flight < cap else None
        chosen = _two_choices(replicas, cap, avoid)
        if chosen is None and avoid is not None and avoid.in_flight < cap and avoid in replicas:
            return avoid
        return chosen

    def pick_model(self, model_id: str, avoid: RoutedReplica | None) -> RoutedReplica | None:
        """A replica with a free slot for a request of model ``model_id``, or ``None`` (exactly
        when :meth:`pick` would give ``None``): a holder of the model, else the one with the
        fewest known models (rendezvous hashing among equals), else any (see the module)."""
        cap = self.max_ongoing
        holders = self.holders.get(model_id)
        if holders:
            if len(holders) == 1:
                only = holders[0]
                if only.in_flight < cap and only is not avoid:
                    return only
            else:
                chosen = _two_choices(holders, cap, avoid)
                if chosen is not None:
                    return chosen
        chosen = self._fewest_models(model_id, avoid)
        return chosen if chosen is not None else self.pick(avoid)

    def _fewest_models(self, model_id: str, avoid: RoutedReplica | None) -> RoutedReplica | None:
        """Among the replicas with a free slot (``avoid`` aside), the one with the fewest known
        models; ties go to the highest rendezvous score of (model, replica id), a choice every
        caller with the same view makes alike."""
        cap = self.max_ongoing
        best: RoutedReplica | None = None
        fewest = 0
        score = b""
        for r in self.replicas:
            if r.in_flight >= cap or r is avoid:
                continue
            count = len(r.models)
            if best is None or count < fewest:
                best, fewest, score = r, count, _rendezvous(model_id, r.replica_id)
            elif count == fewest:
                mine = _rendezvous(model_id, r.replica_id)
                if mine > score:
                    best, score = r, mine
        return best

    def dispatch(self) -> None:
        """Hand free slots to queued callers, oldest first."""
        waiters = self.waiters
        models = self.waiting_models
        while waiters:
            head = waiters[0]
            if head.done():  # timed out or cancelled, not yet removed by its owner
                waiters.popleft()
                continue
            model_id = models.get(head) if models else None
            replica = self.pick(None) if model_id is None else self.pick_model(model_id, None)
            if replica is None:
                return
            replica.in_flight += 1
            waiters.popleft().set_result(replica)

    def note_models(self, replica: RoutedReplica, models: frozenset[str]) -> None:
        """``replica`` (one of ``replicas``) holds ``models`` now: update it and ``holders``."""
        old = replica.models
        replica.models = models
        holders = self.holders
        for model_id in old - models:
            listed = holders[model_id]
            listed.remove(replica)
            if not listed:
                del holders[model_id]
        for model_id in models - old:
            holders.setdefault(model_id, []).append(replica)

    def index_models(self) -> None:
        """Build ``holders`` again from the models of ``replicas`` (after they changed)."""
        holders: dict[str, list[RoutedReplica]] = {}
        for r in self.replicas:
            for model_id in r.models:
                holders.setdefault(model_id, []).append(r)
        self.holders = holders


class _CustomPool(_Pool):
    """The pool of a deployment with a custom router: replicas are chosen by it, asynchronously
    (:meth:`Router.assign`), never by the synchronous picks; a freed slot wakes the oldest
    waiter, which asks the router again (waiters here never get a slot handed to them)."""

    __slots__ = ("custom",)
    custom: CustomRouting

    def __init__(self, key: str, max_queued: int, custom: CustomRouting) -> None:
        super().__init__(key, max_queued)
        self.custom = custom

    def pick(self, avoid: RoutedReplica | None) -> RoutedReplica | None:
        return None

    def pick_model(self, model_id: str, avoid: RoutedReplica | None) -> RoutedReplica | None:
        return None

    def dispatch(self) -> None:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_exception(_Woken())
                return

    def wake_all(self) -> None:
        while self.waiters:
            self.dispatch()


class _Woken(Exception):
    """A waiter of a :class:`_CustomPool` may try again: a slot freed or the replicas changed."""


def _still_retired(
    retired: dict[_ReplicaKey, float], deployments: dict[str, DeploymentEndpoints]
) -> dict[_ReplicaKey, float]:
    """The retirements that have not ended: discovery lists the replica, and its time is not up."""
    now = time.monotonic()
    listed = {
        (ep["replica_id"], ep["host"], ep["port"])
        for endpoints in deployments.values()
        for ep in endpoints["replicas"]
    }
    return {key: until for key, until in retired.items() if key in listed and until > now}


def _two_choices(
    candidates: list[RoutedReplica], cap: int, avoid: RoutedReplica | None
) -> RoutedReplica | None:
    """Among two or more ``candidates``, one with a free slot other than ``avoid``, or ``None``.

    Two random indexes cost O(1) and avoid the herding of "always least loaded" while keeping
    load within a small factor of the best; only when the less loaded pick is full (or is
    ``avoid``) does it scan for the least loaded with room.
    """
    rnd = random.random
    n = len(candidates)
    i = int(rnd() * n)
    j = int(rnd() * (n - 1))
    if j >= i:  # a second index distinct from the first, still uniform
        j += 1
    a = candidates[i]
    b = candidates[j]
    if b.in_flight < a.in_flight:
        a, b = b, a
    if a is avoid:
        a = b
    if a.in_flight < cap and a is not avoid:
        return a
    best: RoutedReplica | None = None
    for r in candidates:
        if r.in_flight < cap and r is not avoid and (best is None or r.in_flight < best.in_flight):
            best = r
    return best


class Router:
    """Replica choice and admission control for every deployment this process talks to."""

    def __init__(
        self, *, max_queued: int = DEFAULT_MAX_QUEUED, secret: bytes | None = None
    ) -> None:
        self._pools: dict[str, _Pool] = {}
        self._max_queued = max_queued
        #: proves this caller to replicas, for what a custom router loads from them
        self.secret = secret
        #: called with the deployment key when a caller starts waiting on a deployment that has
        #: no replica at all (scaled to zero): whoever reports load tells the controller at once
        self.on_starved: Callable[[str], None] | None = None
        #: replicas out of choice (:meth:`retire`) -> until when (``time.monotonic``)
        self._retired: dict[_ReplicaKey, float] = {}
        #: the last table discovery gave, applied again when a retirement ends
        self._last: dict[str, DeploymentEndpoints] = {}

    # -- discovery side ------------------------------------------------------------------------

    def update(self, deployments: dict[str, DeploymentEndpoints]) -> None:
        """Replace the replica table with ``deployments`` (keyed by ``wire.deployment_key``).

        Replicas that remain (same id, host and port) keep their :class:`RoutedReplica` object and
        so their in-flight count; new replicas start at zero; queued callers are handed the new
        slots.
        Callers waiting on a deployment that disappears (its application was deleted) get
        :class:`NoReplicaAvailable` at once, and those on one left with no replica and
        ``unavailable`` set (its application failed to deploy) :class:`DeploymentUnavailable`:
        no replica of it will come. Replicas :meth:`retire` took out stay out.
        """
        self._last = deployments
        retired = self._retired
        if retired:
            retired = self._retired = _still_retired(retired, deployments)
        for key, endpoints in deployments.items():
            pool = self._pools.get(key)
            spec = endpoints.get("request_router")
            if pool is None or spec != (None if pool.custom is None else pool.custom.spec):
                pool = self._new_pool(key, spec, pool)
            known = {r.replica_id: r for r in pool.replicas}
            fresh: list[RoutedReplica] = []
            for ep in endpoints["replicas"]:
                if retired and (ep["replica_id"], ep["host"], ep["port"]) in retired:
                    continue
                old = known.get(ep["replica_id"])
                if old is not None and old.host == ep["host"] and old.port == ep["port"]:
                    fresh.append(old)
                else:
                    fresh.append(RoutedReplica(ep["replica_id"], ep["host"], ep["port"], pool))
            pool.replicas = fresh
            if pool.holders:  # replicas that left must not be chosen as holders
                pool.index_models()
            pool.max_ongoing = max(1, endpoints["max_ongoing_requests"])
            limit = endpoints.get("max_queued_requests", -1)
            pool.max_queued = self._max_queued if limit < 0 else min(limit, self._max_queued)
            pool.backpressure = (
                endpoints.get("backpressure_status", 503),
                endpoints.get("retry_after_s"),
            )
            pool.unavailable = endpoints.get("unavailable", "")
            if isinstance(pool, _CustomPool):
                pool.custom.update(pool.replicas, pool.max_ongoing)
                pool.wake_all()
            else:
                pool.dispatch()
            if pool.unavailable and not pool.replicas:
                _fail_waiters(pool, partial(DeploymentUnavailable, key, pool.unavailable))
        for key in [k for k in self._pools if k not in deployments]:
            pool = self._pools.pop(key)
            if pool.custom is not None:
                pool.custom.close()
            pool.replicas = []
            pool.holders = {}
            _fail_waiters(pool, partial(NoReplicaAvailable, key, "the deployment was removed"))

    def _new_pool(self, key: str, spec: RequestRouterSpec | None, old: _Pool | None) -> _Pool:
        """A pool for ``key`` with the built-in policy, or with the custom router ``spec``;
        callers queued on ``old`` (whose policy changed, or which was made before the first
        snapshot) ask again."""
        pool: _Pool
        if spec is None:
            pool = _Pool(key, self._max_queued)
        else:
            from kubeserve.runtime.custom_router import CustomRouting  # only for custom routers

            pool = _CustomPool(key, self._max_queued, CustomRouting(key, spec, self.secret))
        if old is not None:
            if old.custom is not None:
                old.custom.close()
            while old.waiters:
                waiter = old.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(_Woken())
            old.waiting_models.clear()
        self._pools[key] = pool
        return pool

    # -- request side --------------------------------------------------------------------------

    def try_assign(
        self, key: str, avoid: RoutedReplica | None = None, model_id: str = ""
    ) -> RoutedReplica | None:
        """A slot at once, or ``None`` when the caller would have to wait.

        The synchronous fast path: callers that get a slot here need no task, future or timer.
        Queued callers come first (FIFO), so this returns ``None`` while anyone is waiting.
        ``model_id``: the multiplexed model the request is for ("" for none; see the module).
        """
        pool = self._pools.get(key)
        if pool is None or pool.waiters:
            return None
        replica = pool.pick_model(model_id, avoid) if model_id else pool.pick(avoid)
        if replica is not None:
            replica.in_flight += 1
        return replica

    async def assign(
        self,
        key: str,
        timeout_s: float | None,
        avoid: RoutedReplica | None = None,
        model_id: str = "",
        call: CallInfo | None = None,
    ) -> RoutedReplica:
        """A slot on one replica of ``key``; waits (FIFO) up to ``timeout_s`` when all are full.

        ``avoid`` is a replica to skip if another one has room (used to retry elsewhere);
        ``model_id`` the multiplexed model the request is for ("" for none); ``call`` what a
        handle call tells a custom router (its method and arguments).
        Raises :class:`NoReplicaAvailable` when the queue is full or the wait times out.
        """
        replica = self.try_assign(key, avoid, model_id)
        if replica is not None:
            return replica
        pool = self._pools.get(key)
        if pool is not None and pool.custom is not None:
            return await self._assign_custom(pool, pool.custom, timeout_s, avoid, model_id, call)
        if pool is None:
            pool = self._pools[key] = _Pool(key, self._max_queued)
        if pool.unavailable and not pool.replicas:
            raise DeploymentUnavailable(key, pool.unavailable)
        if len(pool.waiters) >= pool.max_queued:
            raise BackPressure(
                key,
                f"{len(pool.waiters)} requests already queued (max_queued_requests)",
                *pool.backpressure,
            )
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[RoutedReplica] = loop.create_future()
        pool.waiters.append(waiter)
        if model_id:
            pool.waiting_models[waiter] = model_id
        if not pool.replicas and self.on_starved is not None:
            self.on_starved(key)
        # A bare timer on the future instead of asyncio.wait_for: no extra task per waiter.
        timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, waiter)
        try:
            return await waiter
        except TimeoutError:
            reason = "no running replica" if not pool.replicas else "all replicas busy"
            raise NoReplicaAvailable(key, f"{reason} after {timeout_s} s") from None
        except _Woken:  # the deployment's request router changed: its new pool decides
            return await self.assign(key, timeout_s, avoid, model_id, call)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())  # handed a slot just as we were cancelled
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if not waiter.done() or waiter.cancelled() or waiter.exception() is not None:
                _discard(pool.waiters, waiter)
            if model_id:
                pool.waiting_models.pop(waiter, None)
            if (
                not pool.waiters
                and not pool.replicas
                and not pool.unavailable  # kept: it answers the next caller at once
                and self._pools.get(pool.key) is pool
            ):
                del self._pools[pool.key]

    async def _assign_custom(
        self,
        pool: _Pool,
        custom: CustomRouting,
        timeout_s: float | None,
        avoid: RoutedReplica | None,
        model_id: str,
        call: CallInfo | None,
    ) -> RoutedReplica:
        """:meth:`assign` for a deployment with a custom router: ask it, take the slot it
        chose; when none of its choices has room, wait for a slot to free or the backoff, and
        ask again (as Ray's router loop does)."""
        from kubeserve.runtime.custom_router import RouterUnavailable

        key = pool.key
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        pending = custom.pending_request(model_id, call)
        attempt = 0
        while True:
            if pool.unavailable and not pool.replicas:
                raise DeploymentUnavailable(key, pool.unavailable)
            wait_s: float | None = None
            if pool.replicas:
                try:
                    replica = await custom.choose(pool.replicas, pending, avoid)
                except RouterUnavailable as exc:
                    raise DeploymentUnavailable(key, str(exc)) from None
                if replica is not None and replica.in_flight < pool.max_ongoing:
                    replica.in_flight += 1
                    custom.routed(pending, replica)
                    return replica
                wait_s = custom.backoff_s(attempt)
                attempt += 1
            elif self.on_starved is not None:
                self.on_starved(key)
            if len(pool.waiters) >= pool.max_queued:
                raise BackPressure(
                    key,
                    f"{len(pool.waiters)} requests already queued (max_queued_requests)",
                    *pool.backpressure,
                )
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    reason = "no running replica" if not pool.replicas else "all replicas busy"
                    raise NoReplicaAvailable(key, f"{reason} after {timeout_s} s")
                wait_s = left if wait_s is None else min(wait_s, left)
            waiter: asyncio.Future[RoutedReplica] = loop.create_future()
            pool.waiters.append(waiter)
            timer = None if wait_s is None else loop.call_later(wait_s, _wake, waiter)
            try:
                await waiter
            except _Woken:
                if self._pools.get(key) is not pool:  # the router changed: the new pool decides
                    rest = None if deadline is None else max(0.0, deadline - loop.time())
                    return await self.assign(key, rest, avoid, model_id, call)
            finally:
                if timer is not None:
                    timer.cancel()
                if not waiter.done():
                    waiter.cancel()
                _discard(pool.waiters, waiter)

    def retire(self, replica: RoutedReplica) -> bool:
        """``replica`` refused a connection or answered that it shuts down: choose it no more
        while discovery lists it, :data:`RETIRED_S` at most (see the module). False when it was
        not to be chosen anyway (discovery dropped it, or it was retired already)."""
        pool = replica._pool
        if self._pools.get(pool.key) is not pool or replica not in pool.replicas:
            return False
        until = time.monotonic() + RETIRED_S
        self._retired[(replica.replica_id, replica.host, replica.port)] = until
        pool.replicas = [r for r in pool.replicas if r is not replica]
        if pool.holders:
            pool.index_models()
        if isinstance(pool, _CustomPool):
            pool.custom.update(pool.replicas, pool.max_ongoing)
        asyncio.get_running_loop().call_later(RETIRED_S + 0.05, self._end_retirements)
        return True

    def _end_retirements(self) -> None:
        if self._retired:
            self.update(self._last)

    def release(self, replica: RoutedReplica) -> None:
        """Give back a slot from :meth:`assign`; the oldest waiter, if any, gets it next."""
        replica.in_flight -= 1
        pool = replica._pool
        if pool.waiters:
            pool.dispatch()

    def note_models(self, replica: RoutedReplica, value: bytes) -> None:
        """``replica`` answered a multiplexed request with ``value`` in ``wire.MODELS_HEADER``:
        remember the models it holds. Cheap when they did not change (the usual case); ignored
        for a replica that left the table."""
        if value == replica.models_raw:
            return
        replica.models_raw = value
        pool = replica._pool
        if replica in pool.replicas:
            pool.note_models(replica, decode_models(value))

    # -- another process in front of the same replicas ----------------------------------------

    def set_external(self, counts: dict[str, int]) -> None:
        """``{replica id: requests in flight}`` of another process choosing among the same
        replicas (the native data path, :mod:`~kubeserve.runtime.fastpath`; a replica not named
        has none), replacing the last counts. They count in each replica's ``in_flight`` as this
        router's own do, so the choice and ``max_ongoing_requests`` see both; slots that freed
        go to queued callers."""
        for pool in self._pools.values():
            freed = False
            for r in pool.replicas:
                n = counts.get(r.replica_id, 0)
                if n != r.external:
                    freed = freed or n < r.external
                    r.in_flight += n - r.external
                    r.external = n
            if freed and pool.waiters:
                if isinstance(pool, _CustomPool):
                    pool.wake_all()
                else:
                    pool.dispatch()

    def own_in_flight(self) -> dict[str, int]:
        """``{replica id: requests in flight}`` of this router alone (what :meth:`set_external`
        added aside), replicas with none left out: what the other process is told."""
        return {
            r.replica_id: r.in_flight - r.external
            for pool in self._pools.values()
            for r in pool.replicas
            if r.in_flight > r.external
        }

    # -- introspection (metrics, tests) --------------------------------------------------------

    def in_flight(self, key: str) -> dict[str, int]:
        """``{replica_id: requests in flight}`` for the current replicas of ``key``."""
        pool = self._pools.get(key)
        return {} if pool is None else {r.replica_id: r.in_flight for r in pool.replicas}

    def queued(self, key: str) -> int:
        """How many callers wait for a slot on ``key``."""
        pool = self._pools.get(key)
        return 0 if pool is None else len(pool.waiters)

    def queued_counts(self) -> dict[str, int]:
        """``{deployment key: callers waiting}`` for every deployment this router knows."""
        return {key: len(pool.waiters) for key, pool in self._pools.items()}

    def models(self, key: str) -> dict[str, frozenset[str]]:
        """``{replica_id: multiplexed models it is known to hold}`` for the replicas of ``key``."""
        pool = self._pools.get(key)
        return {} if pool is None else {r.replica_id: r.models for r in pool.replicas}

    def replicas(self, key: str) -> list[RoutedReplica]:
        pool = self._pools.get(key)
        return [] if pool is None else list(pool.replicas)


def _rendezvous(model_id: str, replica_id: str) -> bytes:
    """The rendezvous score of a replica for a model: the same in every process (unlike ``hash``),
    and well mixed, so new models spread evenly over replicas."""
    key = f"{model_id}\0{replica_id}".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(key, digest_size=8).digest()


def _fail_waiters(pool: _Pool, error: Callable[[], NoReplicaAvailable]) -> None:
    """Every caller queued on ``pool`` gets its own ``error()``: no replica will come."""
    while pool.waiters:
        waiter = pool.waiters.popleft()
        if not waiter.done():
            waiter.set_exception(error())
    pool.waiting_models.clear()


def _wake(waiter: asyncio.Future[RoutedReplica]) -> None:
    if not waiter.done():
        waiter.set_exception(_Woken())


def _expire(waiter: asyncio.Future[RoutedReplica]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _discard(
    waiters: deque[asyncio.Future[RoutedReplica]], waiter: asyncio.Future[RoutedReplica]
) -> None:
    with contextlib.suppress(ValueError):
        waiters.remove(waiter)  # O(queue) but only on timeout/cancel, never on the hot path
