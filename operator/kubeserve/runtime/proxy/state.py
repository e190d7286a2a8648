"""What every client connection of one proxy shares: routes, router, upstream pools.

Discovery (:mod:`~kubeserve.runtime.discovery` or the Kubernetes one) calls
:meth:`ProxyState.apply` with each snapshot; connections read the state on every request and never
write it, apart from taking and returning pooled upstream connections.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kubeserve.control.routes import RouteTable
from kubeserve.runtime import keepalive
from kubeserve.runtime.channel import Role
from kubeserve.runtime.keepalive import IdlePool, PoolSweeper, pool_for
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.logs import AccessLog
from kubeserve.runtime.metrics import ProxyMetrics
from kubeserve.runtime.proxy.upstream import UpstreamConnection
from kubeserve.runtime.router import RoutedReplica, Router
from kubeserve.runtime.wire import Snapshot, deployment_key

if TYPE_CHECKING:
    from kubeserve.runtime.http_connection import ServerConnection

__all__ = ["CONNECT_TIMEOUT_S", "ProxyState", "UpstreamPool"]

#: How long opening a connection to a replica (and its handshake) may take.
CONNECT_TIMEOUT_S = 10.0
# Paths remembered with their deployment; the memo is dropped whole when it fills up.
_ROUTE_MEMO_SIZE = 4096


class ProxyState:
    """What every client connection of one proxy shares.

    Invariants: ``routes`` and ``routes_body`` are swapped together by :meth:`apply` (one
    snapshot at a time, on the loop); ``pools`` holds one :class:`UpstreamPool` per replica of the
    current snapshot, created lazily; a pool whose replica left is closed and forgotten.
    """

    def __init__(
        self,
        *,
        secret: bytes,
        request_timeout_s: float | None = None,
        keep_alive_timeout_s: float = 90.0,
        limits: RequestLimits | None = None,
        router: Router | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.secret = secret  # proves this proxy to replicas (kubeserve.runtime.channel)
        self.limits = limits or RequestLimits()
        self.router = router or Router(secret=secret)
        self.routes = RouteTable()
        self.keys: dict[str, str] = {}  # route_prefix -> deployment key, computed once per snapshot
        self.labels: dict[str, tuple[str, str, str]] = {}
        self.metrics = metrics or ProxyMetrics()
        #: Ray's access lines, one per request (``logging_config.enable_access_log``); None: off
        self.access_log: AccessLog | None = None
        self.route_memo: dict[bytes, str] = {}  # raw path -> deployment key, for this route table
        self.routes_body = b"{}"
        self.healthy = False
        self.request_timeout_s = request_timeout_s
        # A request waits for a replica as in Ray: until one is free, or request_timeout_s.
        self.assign_timeout_s = request_timeout_s
        self.keep_alive_timeout_s = keep_alive_timeout_s
        #: the proxy is leaving (:meth:`~.server.ProxyServer.leave`): every response from now on
        #: says ``Connection: close``, so keep-alive clients reconnect, to another proxy
        self.leaving = False
        self.pools: dict[str, UpstreamPool] = {}
        self.connections: set[ServerConnection] = set()
        self.sweeper = PoolSweeper(self.pools)

    def apply(self, snapshot: Snapshot) -> None:
        """Install a discovery snapshot (the callback the endpoint source is started with)."""
        self.routes = RouteTable(snapshot["routes"])
        self.keys = {
            r["route_prefix"]: deployment_key(r["app"], r["deployment"]) for r in self.routes.routes
        }
        #: deployment key -> (route, application, deployment): the labels of its requests
        self.labels = {
            deployment_key(r["app"], r["deployment"]): (
                r["route_prefix"],
                r["app"],
                r["deployment"],
            )
            for r in self.routes.routes
        }
        self.route_memo = {}
        self.routes_body = json.dumps(self.routes.prefixes()).encode()
        timeouts = snapshot.get("proxy_timeouts")
        if timeouts is not None:
            self.set_timeouts(timeouts["request_timeout_s"], timeouts["keep_alive_timeout_s"])
        self.router.update(snapshot["deployments"])
        live = {ep["replica_id"] for d in snapshot["deployments"].values() for ep in d["replicas"]}
        for replica_id in [rid for rid in self.pools if rid not in live]:
            self.pools.pop(replica_id).close()
        self.healthy = True

    def set_timeouts(self, request_timeout_s: float | None, keep_alive_timeout_s: float) -> None:
        """Apply ``http_options`` timeouts live: requests routed from now on wait at most
        ``request_timeout_s``; every open client connection idles at most
        ``keep_alive_timeout_s`` (re-armed now when that is sooner than its timer; a WebSocket
        tunnel's connection has no timer and gets none)."""
        self.request_timeout_s = self.assign_timeout_s = request_timeout_s
        if keep_alive_timeout_s == self.keep_alive_timeout_s:
            return
        self.keep_alive_timeout_s = keep_alive_timeout_s
        for conn in self.connections:
            conn.keep_alive_timeout_s = keep_alive_timeout_s
            clock = conn.clock
            if clock is not None and clock.timer is not None:
                clock.arm(keep_alive_timeout_s)

    def deployment_for(self, path: bytes, normalized: str) -> str | None:
        """The deployment key serving raw ``path`` (no query string), whose normal form is
        ``normalized``, or None.

        Memoized per raw path: a path seen before costs one dict lookup instead of a decode and a
        longest-prefix match. Misses (404s) are not remembered, so scans cannot fill the memo.
        Only paths that route to a deployment are remembered, never the proxy's own ``/-/``.
        """
        key = self.route_memo.get(path)
        if key is None:
            route = self.routes.match(normalized)
            if route is None:
                return None
            key = self.keys[route["route_prefix"]]
            if len(self.route_memo) >= _ROUTE_MEMO_SIZE:
                self.route_memo.clear()
            self.route_memo[path] = key
        return key

    def pool(self, replica: RoutedReplica) -> UpstreamPool:
        return pool_for(
            self.pools, replica.replica_id, replica.host, replica.port, self.secret, UpstreamPool
        )

    def close(self) -> None:
        self.sweeper.stop()
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        for conn in list(self.connections):
            conn.close()


class UpstreamPool(IdlePool[UpstreamConnection]):
    """Idle keep-alive connections to one replica, and new ones on demand."""

    __slots__ = ()

    async def connect(self) -> UpstreamConnection:
        return await keepalive.connect(
            lambda: UpstreamConnection(self),
            self.host,
            self.port,
            Role.INGRESS,
            self.secret,
            self.replica_id,
            CONNECT_TIMEOUT_S,
        )
