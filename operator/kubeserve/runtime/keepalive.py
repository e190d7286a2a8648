"""Keep-alive connections to replicas, pooled per replica: shared by the proxy and handle client.

Both talk HTTP/1.1 to replicas, one request at a time per connection, and keep each connection for
the next request; they differ only in what they do with a response (the proxy streams it to a
client, the handle client hands a result to an awaiting caller). So this module holds the
bookkeeping both need and nothing about requests:

* :class:`KeepAliveConnection`, the base of their protocols: ``closed`` once either side closed it,
  ``usable()`` while it may carry another request;
* :class:`IdlePool`, the idle connections to one replica, LIFO (the most recently used connection
  is the warmest: its buffers are in cache and the replica has not timed it out);
* :func:`pool_for`, one pool per replica, replaced when the replica's address changes;
* :func:`connect`, a new connection past the channel handshake
  (:mod:`~kubeserve.runtime.channel`): the replica's same-host unix socket when it has one
  (:mod:`~kubeserve.runtime.local_socket`), else TCP;
* :class:`PoolSweeper`, which closes connections that idled in their pool for a while, before the
  replica's keep-alive timeout can close them.

Why the sweep matters: neither caller replays a request once a byte of it was written (the replica
may have run it), so a pooled connection that the replica closes while a request is being written
on it costs that request a 502. A replica closes only connections idle for its keep-alive timeout
(75 s, :class:`~kubeserve.runtime.replica.http.ReplicaHttpServer`); dropping ours after
:data:`IDLE_SWEEP_S` to twice that keeps the two sides from racing.

Ownership: a pool owns its idle connections (closing the pool closes them); a connection taken from
a pool belongs to its taker until it is put back or closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast

from kubeserve.runtime import channel
from kubeserve.runtime.channel import Role

__all__ = ["IDLE_SWEEP_S", "IdlePool", "KeepAliveConnection", "PoolSweeper", "connect", "pool_for"]

#: How often idle pooled connections are swept: one idle for a whole period (so between one and
#: two periods) is closed. Must stay under half the replica's keep-alive timeout (75 s).
IDLE_SWEEP_S = 15.0


class KeepAliveConnection(asyncio.Protocol):
    """A connection to a replica that may carry one request after another."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.closed = False
        self.recent = True  # put back in its pool since the last sweep

    def usable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)


C = TypeVar("C", bound=KeepAliveConnection)
P = TypeVar("P", bound="IdlePool")  # type: ignore[type-arg]


class IdlePool(Generic[C]):
    """Idle keep-alive connections to one replica (LIFO: the most recently used is reused first)."""

    __slots__ = ("closed", "host", "idle", "port", "replica_id", "secret")

    def __init__(self, replica_id: str, host: str, port: int, secret: bytes) -> None:
        self.replica_id = replica_id  # whom new connections' handshakes name
        self.host = host
        self.port = port
        self.secret = secret  # the instance's data-plane secret, for new connections
        self.idle: list[C] = []
        self.closed = False

    def take(self) -> C | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
        return None

    def put(self, conn: C) -> None:
        if self.closed:
            conn.close()
        else:
            conn.recent = True
            self.idle.append(conn)

    def sweep(self) -> None:
        """Close connections that stayed idle since the previous sweep; mark the others."""
        kept = []
        for conn in self.idle:
            if conn.recent and conn.usable():
                conn.recent = False
                kept.append(conn)
            else:
                conn.close()
        self.idle = kept

    def discard(self, conn: C) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class PoolSweeper:
    """Sweeps every pool of ``pools`` each ``period_s`` (one timer per process, not per
    connection: the hot path only sets a flag on :meth:`IdlePool.put`)."""

    def __init__(self, pools: Mapping[str, IdlePool[Any]], period_s: float = IDLE_SWEEP_S) -> None:
        self._pools = pools
        self._period_s = period_s
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._period_s, self._sweep)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sweep(self) -> None:
        for pool in list(self._pools.values()):
            pool.sweep()
        self._timer = asyncio.get_running_loop().call_later(self._period_s, self._sweep)


def pool_for(
    pools: dict[str, P],
    replica_id: str,
    host: str,
    port: int,
    secret: bytes,
    make: Callable[[str, str, int, bytes], P],
) -> P:
    """The pool of ``replica_id`` in ``pools``; a new one (the old one closed) when the replica's
    address changed."""
    pool = pools.get(replica_id)
    if pool is None or pool.host != host or pool.port != port:
        if pool is not None:
            pool.close()
        pool = pools[replica_id] = make(replica_id, host, port, secret)
    return pool


async def connect(
    factory: Callable[[], C],
    host: str,
    port: int,
    role: Role,
    secret: bytes,
    replica_id: str,
    timeout_s: float | None = None,
) -> C:
    """A new connection to replica ``replica_id`` on ``host:port`` carrying ``role``: same-host
    unix socket, else TCP, sealed (:mod:`~kubeserve.runtime.sealing`). Raises
    :class:`~kubeserve.runtime.channel.ChannelError` (an ``OSError``) when the peer is not that
    replica of this instance."""
    return await channel.connect(factory, host, port, role, secret, replica_id, timeout_s)
