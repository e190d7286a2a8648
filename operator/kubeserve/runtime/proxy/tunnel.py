"""WebSockets through the proxy: a client connection spliced to a replica connection after a 101.

A WebSocket handshake is an ordinary request to the proxy (:mod:`.client`, :mod:`.exchange`): routed
on its path, given a replica slot by the router, forwarded with the request id on a connection of
its own to the replica (never a pooled one: it will not come back). What changes is what follows
the request head, which is not HTTP/1 any more:

* from the upgrade on, the client's transport is read by a :class:`ClientEnd` (``set_protocol``):
  until the replica answers, it holds what the client sends (at most :data:`_EARLY_LIMIT` bytes
  before it stops reading), and hands the connection's life and flow control back to the
  :class:`~.client.ClientConnection`, so a refusal (404, 503, the replica's 403...) is answered as
  any response is, and the connection then closes;
* on the replica's ``101`` (relayed as received, plus ``Upgrade``/``Connection``), a
  :class:`Tunnel` splices the two transports: bytes go through both ways as they arrive, no frame
  is parsed, and either side's backpressure pauses reading the other; a client that takes nothing
  of what the replica sends for ``send_timeout_s`` is aborted (as an HTTP response's reader is);
* when either side closes, the other is closed (after what was already written to it) and the
  replica slot is released: a WebSocket holds one slot of the router for its whole life, as it
  counts as one ongoing request on its replica.

The proxy's HTTP fast path pays nothing for this: the protocol switch moves the connection to
these classes, and the exchange checks one flag when it starts.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from kubeserve.runtime.proxy.client import ClientConnection
    from kubeserve.runtime.proxy.exchange import Exchange
    from kubeserve.runtime.router import RoutedReplica

__all__ = ["ClientEnd", "Tunnel"]

#: What a client may send behind its handshake before the replica accepted it.
_EARLY_LIMIT = 64 * 1024
#: The status a WebSocket is recorded with in the proxy's metrics and access log, once it closed.
_SWITCHED = 101


class ClientEnd(asyncio.Protocol):
    """The client connection of a WebSocket handshake, from the upgrade on: waiting for the
    replica's answer (the :class:`~.client.ClientConnection` still in charge), then spliced."""

    def __init__(self, client: ClientConnection, ex: Exchange, early: bytes) -> None:
        self.client = client
        self.early = bytearray(early)
        self.tunnel: Tunnel | None = None
        self.peer: asyncio.Transport | None = None  # the replica's transport, once spliced
        self.stalled: asyncio.TimerHandle | None = None  # the send timeout while writes pause
        ex.client_end = self

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None:
            peer.write(data)
            return
        self.early += data
        if len(self.early) > _EARLY_LIMIT:
            self.client.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the client is done: close, which ends the handshake or the tunnel

    def connection_lost(self, exc: Exception | None) -> None:
        self._unstall()
        if self.tunnel is not None:
            self.tunnel.end()
        self.client.connection_lost(exc)  # the client connection's bookkeeping (and abort)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()
            client = self.client
            self.stalled = client.loop.call_later(
                client.limits.send_timeout_s, client.transport.abort
            )
        else:
            self.client.pause_writing()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self._unstall()
            self.peer.resume_reading()
        else:
            self.client.resume_writing()

    def _unstall(self) -> None:
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None


class _ReplicaEnd(asyncio.Protocol):
    """The replica's connection of a spliced WebSocket."""

    def __init__(self, tunnel: Tunnel, client: asyncio.Transport) -> None:
        self.tunnel = tunnel
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.end()

    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


class Tunnel:
    """A WebSocket spliced between a client and a replica; owns the replica slot until
    :meth:`end` (exactly once, when either side closed)."""

    def __init__(
        self,
        ex: Exchange,
        replica: RoutedReplica | None,
        client_end: ClientEnd,
        upstream: asyncio.BaseTransport,
        from_replica: bytes,
    ) -> None:
        self.ex = ex
        self.replica = replica
        self.client_end = client_end
        client = client_end.client
        self.client = client.transport
        self.upstream = cast(asyncio.Transport, upstream)
        self.done = False
        self.upstream.set_protocol(_ReplicaEnd(self, self.client))
        client_end.tunnel = self
        client_end.peer = self.upstream
        if from_replica:  # frames the replica sent right behind its 101
            self.client.write(from_replica)
        early, client_end.early = bytes(client_end.early), bytearray()
        if early:  # frames the client sent right behind its handshake
            self.upstream.write(early)
        if not client.closed:
            self.client.resume_reading()

    def end(self) -> None:
        """One side closed: close the other (after what was written to it), release the slot."""
        if self.done:
            return
        self.done = True
        self.client.close()
        self.upstream.close()
        if self.replica is not None:
            self.client_end.client.state.router.release(self.replica)
            self.replica = None
        self.ex.tunnel_ended(_SWITCHED)
