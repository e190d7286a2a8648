"""One WebSocket on a replica: the upgraded connection, framed with wsproto, speaking ASGI messages.

The replica's HTTP server (:mod:`~kubeserve.runtime.replica.http`) parses the handshake request
with httptools; when httptools stops at the upgrade, the connection's transport is handed to a
:class:`WebSocketSession` (``transport.set_protocol``), which from then on receives every byte.
The ASGI bridge (:func:`~kubeserve.runtime.replica.asgi.run_websocket`) drives it:

* **handshake**: the request is validated by wsproto (``Sec-WebSocket-Key``, version 13) when the
  session is made (:attr:`WebSocketSession.invalid` says why it is not one); :meth:`accept`
  writes the ``101`` (the accept key, the chosen subprotocol, the app's extra headers). A refusal
  (the app closing before accepting, a failure) is a plain HTTP answer the server writes;
* **messages**: fragmented messages are reassembled; one larger than ``max_message_bytes`` (the
  replica's request body limit) closes the connection with ``1009``. Pings are answered here;
* **closing**: a close from the client is answered and the app receives ``websocket.disconnect``
  with its code and reason; :meth:`close` sends the app's close frame, then reads (and drops)
  what the client still sends until its close frame answers, for at most :data:`CLOSE_LINGER_S`,
  before it closes the connection (RFC 6455 7.1.1): closing a socket with unread bytes would
  reset it, and a reset may destroy the close frame before the client reads it (a client still
  sending an oversized message would never see its 1009); a connection lost without a close
  frame is ``1006``;
* **flow control**: reading pauses while :data:`_INBOX_HIGH` messages wait for the app, and
  :meth:`send` waits while the client reads slower than the app writes; a client that takes
  nothing for ``send_timeout_s`` is aborted (the app's ``send`` raises, its slot is freed);
* **keepalive**: every :data:`PING_INTERVAL_S` the session pings the client (as uvicorn's default
  WebSocket server does); a client that sent nothing at all, not even the pong, by the next tick
  is gone without a word (a dropped network): the socket is closed with ``1011`` and its
  ongoing-request slot freed, instead of being held until TCP gives up.

Bytes that arrive before the app accepted (a client may send frames right behind its handshake)
are held, at most :data:`_EARLY_LIMIT` of them before reading pauses, and framed once accepted.

Invariant: ``state`` goes CONNECTING -> OPEN -> CLOSED (or CONNECTING -> CLOSED when refused);
the app receives exactly one ``websocket.disconnect`` kind of answer once the socket is closed,
repeated to any later ``receive``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wsproto import ConnectionType, WSConnection
    from wsproto.connection import ConnectionState
    from wsproto.events import (
        AcceptConnection,
        BytesMessage,
        CloseConnection,
        Message,
        Ping,
        TextMessage,
    )
    from wsproto.utilities import RemoteProtocolError

__all__ = [
    "ABNORMAL_CLOSURE",
    "CLOSE_LINGER_S",
    "GOING_AWAY",
    "INTERNAL_ERROR",
    "MESSAGE_TOO_BIG",
    "NORMAL_CLOSURE",
    "PING_INTERVAL_S",
    "SessionState",
    "WebSocketGone",
    "WebSocketSession",
]

NORMAL_CLOSURE = 1000
GOING_AWAY = 1001
#: never sent: what the app is told when the connection ended without a close frame
ABNORMAL_CLOSURE = 1006
MESSAGE_TOO_BIG = 1009
INTERNAL_ERROR = 1011

#: Messages waiting for the app before the session stops reading the client.
_INBOX_HIGH = 16
#: Bytes received before the app accepted, held until it does, before reading pauses.
_EARLY_LIMIT = 64 * 1024
#: How often an open socket pings its client; silence for a whole period after a ping ends it.
PING_INTERVAL_S = 20.0
#: How long a socket closed by the server waits for the client's close frame before it closes.
CLOSE_LINGER_S = 10.0

Event = dict[str, Any]


_wsproto_loaded = False


def _load_wsproto() -> None:
    """Import wsproto (and h11 under it) with the first session: most replicas never serve a
    WebSocket, and these modules are 2 MB of a replica's memory."""
    global _wsproto_loaded, ConnectionType, WSConnection, ConnectionState, AcceptConnection
    global BytesMessage, CloseConnection, Message, Ping, TextMessage, RemoteProtocolError
    from wsproto import ConnectionType, WSConnection
    from wsproto.connection import ConnectionState
    from wsproto.events import (
        AcceptConnection,
        BytesMessage,
        CloseConnection,
        Message,
        Ping,
        TextMessage,
    )
    from wsproto.utilities import RemoteProtocolError

    _wsproto_loaded = True


class WebSocketGone(OSError):
    """Sending on a WebSocket that is closed: the ASGI spec's ``OSError`` (Starlette turns it into
    ``WebSocketDisconnect``)."""


class SessionState(Enum):
    CONNECTING = 0
    OPEN = 1
    CLOSED = 2


class WebSocketSession(asyncio.Protocol):
    """The server side of one WebSocket, the protocol of its transport from the upgrade on.

    ``headers`` and ``target`` are the handshake request's (as sent); ``early`` the bytes that
    followed its head in the same read; ``on_lost`` is called once when the connection is gone
    (the HTTP server's own bookkeeping of its connections).
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        headers: list[tuple[bytes, bytes]],
        target: bytes,
        *,
        max_message_bytes: int | None,
        early: bytes = b"",
        on_lost: Callable[[Exception | None], None] | None = None,
        ping_interval_s: float | None = PING_INTERVAL_S,
        send_timeout_s: float | None = None,
    ) -> None:
        if not _wsproto_loaded:
            _load_wsproto()
        self.transport = transport
        self.send_timeout_s = send_timeout_s
        self.max_message_bytes = max_message_bytes
        self.ping_interval_s = ping_interval_s
        self.on_lost = on_lost
        self.state = SessionState.CONNECTING
        self.ws = WSConnection(ConnectionType.SERVER)
        #: why the handshake request is not a valid WebSocket one (answered 400), or ""
        self.invalid = ""
        try:
            self.ws.initiate_upgrade_connection(headers, target)
        except RemoteProtocolError as exc:
            self.invalid = str(exc)
        else:
            list(self.ws.events())  # the Request event: the server has the request already
        self.early = bytearray(early)
        self.inbox: deque[Event] = deque()
        self.parts: list[Any] = []  # the pieces of the message being received
        self.part_bytes = 0
        #: the ``websocket.disconnect`` the app receives once the socket is closed
        self.disconnect: Event | None = None
        self.lost = False
        self.reading = True
        self.write_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._ping_timer: asyncio.TimerHandle | None = None
        #: set while a close frame we sent waits for the client's answer (see close)
        self._linger_timer: asyncio.TimerHandle | None = None
        self.heard = False  # something arrived since the last ping
        self.pinged = False  # a ping went out

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.state is SessionState.CONNECTING:
            self.early += data
            if len(self.early) > _EARLY_LIMIT:
                self._hold_reading(True)
            return
        if self.state is SessionState.OPEN:
            self._feed(data)
        elif self._linger_timer is not None:
            self._drop_until_close(data)
        # else CLOSED: the transport is closing; what still arrives is dropped

    def eof_received(self) -> bool | None:
        return None  # the client is done sending: close (connection_lost tells the app)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_pinging()
        self._stop_lingering()
        self.state = SessionState.CLOSED
        self._closed(ABNORMAL_CLOSURE, "")
        self._wake_writer()
        if self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost(exc)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # -- what the ASGI bridge calls ----------------------------------------------------------------

    def accept(self, subprotocol: str | None, headers: list[tuple[bytes, bytes]]) -> None:
        """Write the ``101`` and start framing (the bytes held since the handshake first)."""
        if self.lost or self.state is SessionState.CLOSED:
            raise WebSocketGone("the connection closed before the WebSocket was accepted")
        if self.state is not SessionState.CONNECTING:
            raise RuntimeError("the WebSocket was accepted already")
        self.transport.write(
            self.ws.send(AcceptConnection(subprotocol=subprotocol, extra_headers=headers))
        )
        self.state = SessionState.OPEN
        if self.ping_interval_s is not None:
            loop = asyncio.get_running_loop()
            self._ping_timer = loop.call_later(self.ping_interval_s, self._keepalive)
        early, self.early = bytes(self.early), bytearray()
        self._hold_reading(False)
        if early:
            self._feed(early)

    def refused(self) -> None:
        """The handshake was answered with an HTTP response (by the server): no socket."""
        self.state = SessionState.CLOSED
        self._closed(ABNORMAL_CLOSURE, "")

    async def receive(self) -> Event:
        """The next ``websocket.receive``, or ``websocket.disconnect`` once closed."""
        inbox = self.inbox
        while not inbox:
            if self.disconnect is not None:
                return self.disconnect
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = inbox.popleft()
        if not self.reading and len(inbox) < _INBOX_HIGH // 2 and self.state is SessionState.OPEN:
            self._hold_reading(False)
        return event

    async def send(self, data: str | bytes) -> None:
        """One text (``str``) or binary message; raises :class:`WebSocketGone` once closed."""
        if self.state is not SessionState.OPEN or self.lost:
            raise WebSocketGone("the WebSocket is closed")
        event = TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)
        self.transport.write(self.ws.send(event))
        if self.write_paused:  # backpressure: a slow client slows the app
            loop = asyncio.get_running_loop()
            self._drained = loop.create_future()
            timeout = self.send_timeout_s
            stalled = None if timeout is None else loop.call_later(timeout, self.transport.abort)
            try:
                await self._drained
            finally:
                if stalled is not None:
                    stalled.cancel()
            if self.lost:
                raise WebSocketGone("the client left")

    def close(self, code: int = NORMAL_CLOSURE, reason: str = "") -> None:
        """Send a close frame (if the socket is open) and close the connection; the app's
        ``receive`` then answers ``websocket.disconnect`` with this code."""
        open_states = (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING)
        if self.state is SessionState.OPEN and not self.lost and self.ws.state in open_states:
            self.transport.write(self.ws.send(CloseConnection(code=code, reason=reason or None)))
        self.state = SessionState.CLOSED
        self._stop_pinging()
        self._closed(code, reason)
        if self.ws.state is ConnectionState.LOCAL_CLOSING and not self.lost:
            # The client has not closed yet: read until its close frame answers ours.
            if self._linger_timer is None:
                loop = asyncio.get_running_loop()
                self._linger_timer = loop.call_later(CLOSE_LINGER_S, self._end_lingering)
            self._hold_reading(False)
        else:
            self.transport.close()

    # -- framing -----------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        ws = self.ws
        self.heard = True
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, Message):
                if not self._add_part(event):
                    return
            elif isinstance(event, Ping):
                self.transport.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.REMOTE_CLOSING:
                    self.transport.write(ws.send(event.response()))
                self.state = SessionState.CLOSED
                self._closed(int(event.code), event.reason or "")
                self.transport.close()
                return
        if len(self.inbox) >= _INBOX_HIGH:
            self._hold_reading(True)

    def _add_part(self, event: Message[Any]) -> bool:
        """One piece of a message; the whole message goes to the inbox. False when the message
        grew past ``max_message_bytes`` (the connection is then closed with 1009)."""
        data = event.data
        if isinstance(data, str):
            size = len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass"))
        else:
            size = len(data)
        self.part_bytes += size
        cap = self.max_message_bytes
        if cap is not None and self.part_bytes > cap:
            self.parts.clear()
            self.close(MESSAGE_TOO_BIG, f"message larger than {cap} bytes")
            return False
        self.parts.append(data)
        if event.message_finished:
            parts, self.parts = self.parts, []
            self.part_bytes = 0
            if isinstance(event, TextMessage):
                text = parts[0] if len(parts) == 1 else "".join(parts)
                self.inbox.append({"type": "websocket.receive", "text": text})
            else:
                blob = bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
                self.inbox.append({"type": "websocket.receive", "bytes": blob})
            self._wake_reader()
        return True

    # -- keepalive ---------------------------------------------------------------------------------

    def _keepalive(self) -> None:
        """The ping timer: end a socket whose client stayed silent since the last ping, else
        ping it again."""
        self._ping_timer = None
        if self.state is not SessionState.OPEN or self.lost or self.ping_interval_s is None:
            return
        if not self.heard and self.pinged:
            self.close(INTERNAL_ERROR, "keepalive ping timeout")
            self.transport.abort()  # what is unsent would never reach a silent peer
            return
        self.heard = False
        self.pinged = True
        self.transport.write(self.ws.send(Ping(payload=b"kubeserve")))
        loop = asyncio.get_running_loop()
        self._ping_timer = loop.call_later(self.ping_interval_s, self._keepalive)

    def _drop_until_close(self, data: bytes) -> None:
        """After our close frame: drop what the client sends until its own close frame."""
        try:
            self.ws.receive_data(data)
            answered = any(isinstance(e, CloseConnection) for e in self.ws.events())
        except RemoteProtocolError:
            answered = True
        if answered:
            self._end_lingering()

    def _end_lingering(self) -> None:
        self._stop_lingering()
        self.transport.close()

    def _stop_lingering(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None

    def _stop_pinging(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None

    # -- bookkeeping -------------------------------------------------------------------------------

    def _closed(self, code: int, reason: str) -> None:
        """The socket is closed (first call wins): the app's receive gets the disconnect."""
        if self.disconnect is None:
            self.disconnect = {"type": "websocket.disconnect", "code": code, "reason": reason}
        self._wake_reader()

    def _hold_reading(self, hold: bool) -> None:
        if hold == self.reading and not self.lost:
            self.reading = not hold
            if hold:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _wake_reader(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
