"""The server side of one HTTP/1.1 connection, shared by the proxy and the replica server.

Both servers parse requests with httptools inside an ``asyncio.Protocol`` and differ only in what
a parsed request becomes (the proxy forwards it, the replica runs a handler). What they share lives
in :class:`ServerConnection`, the base of :class:`~kubeserve.runtime.proxy.client.ClientConnection`
and of the replica server's connection (:mod:`~kubeserve.runtime.replica.http`):

* **the connection's life**: the transport and the loop kept from ``connection_made`` (on Python
  3.11 ``get_running_loop()`` costs a ``getpid()``, so it is never looked up per request), the
  server's set of open connections, ``closed`` once the peer or we ended it;
* **flow control** (as uvicorn's ``flow_control.py``): ``reading`` follows what the server asked of
  the transport (:meth:`ServerConnection.hold_reading`); ``write_paused`` follows the transport's
  ``pause_writing``/``resume_writing``, and :meth:`ServerConnection.drain` waits for the resume;
* **parsing with limits**: :meth:`ServerConnection.feed` maps httptools' errors and a
  :class:`RequestRefused` raised from a callback to one :meth:`ServerConnection.refuse` call; the
  request target, head and body are bounded by :class:`~kubeserve.runtime.limits.RequestLimits`
  (414, 431, 413);
* **the lazy connection timer** (:meth:`ServerConnection.tick`): one timer per connection, kept by
  its :class:`~kubeserve.runtime.limits.RequestClock` and re-armed for the nearest deadline: the
  keep-alive timeout while idle, the head and body timeouts while a request arrives, and the send
  timeout while the transport's writes are paused (a client that reads nothing of its response is
  aborted, which ends its request and releases what it held).

Invariant: ``transport``, ``loop`` and ``clock`` are set from ``connection_made`` on, and the
connection is in ``connections`` from then until ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import httptools

from kubeserve.runtime.channel import peer_description
from kubeserve.runtime.limits import RequestClock, RequestLimits

__all__ = ["RequestRefused", "ServerConnection", "body_too_large", "head_too_large"]

log = logging.getLogger(__name__)

#: How long a connection closed by :meth:`ServerConnection.close_lingering` goes on reading (and
#: dropping) what the client still sends, at most: until the client's end of the stream, as
#: nginx's ``lingering_close``.
LINGER_S = 2.0


class RequestRefused(Exception):
    """Raised from a parser callback to stop parsing a request the server refuses:
    ``RequestRefused(status, message)``."""


def body_too_large(cap: int) -> bytes:
    """The 413 message of a body over ``max_body_bytes``."""
    return b"request body larger than %d bytes" % cap


def head_too_large(limit: int) -> bytes:
    """The 431 message of a head over ``max_header_bytes``."""
    return b"request head larger than %d bytes" % limit


class ServerConnection(asyncio.Protocol):
    """One client connection of an HTTP/1.1 server; subclasses give the httptools callbacks,
    :meth:`refuse`, :meth:`upgraded` and :meth:`time_left`."""

    def __init__(
        self,
        limits: RequestLimits,
        keep_alive_timeout_s: float,
        connections: set[ServerConnection],
    ) -> None:
        self.limits = limits
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.connections = connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set on connect
        self.clock: RequestClock = None  # type: ignore[assignment]  # set on connect
        self.closed = False
        self.reading = True
        self.write_paused = False
        self.write_paused_at = 0.0  # loop time of the last pause_writing
        self.drained: asyncio.Future[None] | None = None
        self.read_size = 0  # bytes in the current read
        self.idle_since = 0.0
        self.linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not assert.
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)
        loop = self.loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        self.clock = RequestClock(self.limits, loop, self.tick)
        self.clock.arm(min(self.keep_alive_timeout_s, self.limits.header_timeout_s))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        if self.clock is not None:
            self.clock.cancel()
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self._wake_writer()

    def pause_writing(self) -> None:
        self.note_write_paused()

    def note_write_paused(self) -> None:
        """Writes are paused (the client reads slower than we write): the send timeout runs."""
        self.write_paused = True
        self.write_paused_at = self.loop.time()
        self.clock.arm(self.limits.send_timeout_s, self.write_paused_at)

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # -- flow control ------------------------------------------------------------------------------

    def hold_reading(self, hold: bool) -> None:
        """Pause reading the client (``hold``) or resume it; a no-op when already so."""
        if hold == self.reading:
            self.reading = not hold
            if hold:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    async def drain(self) -> None:
        """Wait until the transport takes writes again (or the connection is gone)."""
        if self.write_paused and not self.closed:
            self.drained = self.loop.create_future()
            await self.drained

    def _wake_writer(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- parsing -----------------------------------------------------------------------------------

    def feed(self, data: bytes) -> bool:
        """Parse one read; False when parsing stopped (the request was refused or upgraded, or
        the connection is closing: a lingering close drops what still arrives)."""
        if self.closed:
            return False
        self.read_size = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.upgraded(data[exc.args[0] :])
            return False
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, RequestRefused):
                self.refuse(*refused.args)
            elif not self.closed:
                self.refuse(400, b"malformed HTTP request")
            return False
        return True

    def note_partial(self, head_done: bool) -> bool:
        """The read ended inside a request: note it for the timeouts, and refuse (431, False) a
        head that grew past ``max_header_bytes``, which bounds what it can make us buffer."""
        if self.clock.partial(head_done, self.read_size):
            return True
        self.refuse(431, head_too_large(self.limits.max_header_bytes))
        return False

    def check_url(self, url: bytes) -> None:
        """Refuse (414) a request target, as received so far, longer than ``max_url_bytes``."""
        if len(url) > self.limits.max_url_bytes:
            raise RequestRefused(
                414, b"request target longer than %d bytes" % self.limits.max_url_bytes
            )

    def refuse(self, status: int, message: bytes) -> None:
        """Answer a request that cannot be parsed or kept, then close."""
        raise NotImplementedError

    def upgraded(self, rest: bytes) -> None:
        """httptools stopped after a request asking for a protocol upgrade (or CONNECT): what
        follows, starting with ``rest`` (the bytes of this read after the request), is not
        HTTP/1. The parser is done with this connection either way."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush what is buffered, then close (``closed`` turns True in ``connection_lost``)."""
        if not self.closed:
            self.transport.close()

    def close_lingering(self) -> None:
        """End the connection after an answer to a request the client may still be sending
        (400, 408, 413, 431...): flush, half-close, and read and drop what still arrives until
        the client's end of the stream, for :data:`LINGER_S` at most. Closing at once with
        unread bytes makes the kernel answer with a reset, and a reset can destroy the answer
        in the client's receive buffer before the client reads it. ``closed`` turns True at
        once: nothing more is parsed or written. (A TLS or sealed layer has no half-close: it
        closes at once, after its own close message.)"""
        if self.closed:
            return
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            self.close()
            self.closed = True
            return
        self.closed = True
        transport.write_eof()
        transport.resume_reading()
        self.linger = self.loop.call_later(LINGER_S, transport.close)

    # -- the connection timer ----------------------------------------------------------------------

    def tick(self) -> None:
        """The connection timer fired: ask :meth:`time_left` and re-arm for what it says."""
        clock = self.clock
        clock.fired()
        if self.closed:
            return
        now = self.loop.time()
        if self.write_paused:
            unsent = self.write_paused_at + self.limits.send_timeout_s - now
            if unsent <= 0:
                self.send_timed_out()
                return
        remaining = self.time_left(now)
        if remaining is not None:
            if self.write_paused:
                remaining = min(remaining, unsent)
            clock.arm(max(remaining, 0.001), now)

    def send_timed_out(self) -> None:
        """The client took no byte of its response for ``send_timeout_s``: abort the connection
        (what is unsent would never be read), which ends the request it was answering."""
        log.info(
            "aborted a connection from %s: it read nothing of its response for %.0f s",
            peer_description(self.transport),
            self.limits.send_timeout_s,
        )
        self.transport.abort()

    def time_left(self, now: float) -> float | None:
        """Seconds until the timer must fire again; None when the connection was answered or
        closed for being late."""
        raise NotImplementedError

    def idle_time_left(self, now: float) -> float | None:
        """The keep-alive timeout of a connection between requests (the header timeout, when
        shorter, for a new connection that has not sent a byte yet); closes it when it is up."""
        timeout = self.keep_alive_timeout_s
        if not self.read_size:  # nothing read since accept
            timeout = min(timeout, self.limits.header_timeout_s)
        remaining = self.idle_since + timeout - now
        if remaining <= 0:
            self.close()
            return None
        return remaining
