"""The proxy's side of a client connection: the HTTP/1 request state machine.

Parses requests with httptools (:class:`~kubeserve.runtime.http_connection.ServerConnection` gives
the connection's life, flow control, limits and timer) and turns each into an
:class:`~kubeserve.runtime.proxy.exchange.Exchange`, driven in order: the one being forwarded is
``active``, pipelined ones wait behind it.

The fast paths, marked where they are used: routing, the replica choice and taking a pooled
upstream connection happen inside ``data_received`` (a task exists only when a request must wait);
a request that arrived whole in one read and needs no change is forwarded as the very bytes read;
what one read produced for the replica leaves in one ``writelines``.

A WebSocket handshake is parsed and routed as any request; when httptools stops at its upgrade,
the connection is handed to :class:`~kubeserve.runtime.proxy.tunnel.ClientEnd` (the rest of its
life, see :mod:`~kubeserve.runtime.proxy.tunnel`). Other upgrades (h2c...) and CONNECT get 501.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from kubeserve.control.routes import origin_form
from kubeserve.runtime.http1 import (
    CHUNKED_END,
    HOP_OR_CHUNKED_NAME_LENGTHS,
    REQUEST_ID,
    HeaderKind,
    classify_header,
    is_websocket,
    local_response,
    new_request_id,
    usable_request_id,
)
from kubeserve.runtime.http_connection import ServerConnection, body_too_large, head_too_large
from kubeserve.runtime.proxy.exchange import BUFFER_BEFORE_SLOT, Exchange
from kubeserve.runtime.proxy.tunnel import ClientEnd
from kubeserve.sdk.multiplex import MODEL_ID_HEADER

if TYPE_CHECKING:
    from kubeserve.runtime.proxy.state import ProxyState

__all__ = ["ClientConnection"]

# Body bytes buffered while waiting for a slot or an upstream connection before the client is
# paused: never below what a request may buffer before it asks for a slot, or it would wait forever.
_PENDING_HIGH_WATER = BUFFER_BEFORE_SLOT
_CONNECT = b"CONNECT"
_MODEL_ID = MODEL_ID_HEADER.encode()
_MODEL_ID_SIZE = len(_MODEL_ID)
_GET = b"GET"
_EXPECT = b"expect"


class ClientConnection(ServerConnection):
    """One client connection: parses requests with httptools and drives their exchanges in order.

    Invariant: ``active`` is the exchange being forwarded; pipelined requests parsed behind it wait
    in ``pipeline`` (their bodies buffered; reading pauses so at most one read's worth piles up).
    ``clock`` (:class:`~kubeserve.runtime.limits.RequestClock`) holds the deadlines of the request
    being received and the one timer of the connection (:meth:`time_left`).
    """

    def __init__(self, state: ProxyState) -> None:
        super().__init__(state.limits, state.keep_alive_timeout_s, state.connections)
        self.state = state
        self.parsing: Exchange | None = None
        self.begun = 0  # requests begun in the current read
        self.active: Exchange | None = None
        self.pipeline: deque[Exchange] = deque()
        self.upstream_write_paused = False
        self.upgrade_refused = False
        self.upgrading: Exchange | None = None  # the WebSocket handshake the parser stops at

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        fresh = self.parsing is None  # this read starts a new request (or is garbage)
        self.begun = 0
        if not self.feed(data):
            return
        parsing = self.parsing
        if parsing is not None:  # the read ended inside a request: note it for the timeouts
            if not self.note_partial(parsing.head_done):
                return
        elif fresh and self.begun == 1:
            # Verbatim: the read held one whole request from its first byte to its last (a byte
            # more would have begun another), so ``data`` is that request as parsed.
            last = self.pipeline[-1] if self.pipeline else self.active
            if last is not None:
                last.take_raw(data)
        active = self.active
        if active is not None:
            active.pump()
        self.update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.active is not None:
            self.active.abort()
            self.active = None
        for ex in self.pipeline:
            ex.abort()
        self.pipeline.clear()

    def pause_writing(self) -> None:
        # The client reads slower than the replica writes: stop reading the replica (and, should
        # the client take nothing for send_timeout_s, abort it, which releases the slot).
        self.note_write_paused()
        up = self.active.upstream if self.active is not None else None
        if up is not None:
            up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        up = self.active.upstream if self.active is not None else None
        if up is not None:
            up.transport.resume_reading()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
        ex = Exchange(self)
        self.parsing = ex
        if self.active is None:
            self.active = ex
        else:
            self.pipeline.append(ex)

    def on_url(self, url: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        ex.url += url
        self.check_url(ex.url)

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        # Most names cannot be special: one len() spares the call (see classify_header), and
        # a first letter spares lower-casing Content-Type to compare it with X-Request-Id.
        size = len(name)
        if size in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                ex.dropped = True
                if size == 7 and name.lower() == b"upgrade":
                    ex.upgrade_to = value
                return
            if kind == HeaderKind.CHUNKED:
                ex.body_chunked = True
        elif size == 14:
            if name.lower() == b"content-length":
                self._check_length(ex, value)
        elif size == 12 and name[0] | 0x20 == 0x78 and name.lower() == REQUEST_ID and value:
            if not usable_request_id(value):  # replaced by one of ours: never logged or echoed
                ex.dropped = True
                return
            ex.request_id = ex.request_id or value
        elif size == 6 and name[0] | 0x20 == 0x65 and name.lower() == _EXPECT:  # 0x65: "e"
            ex.expects_continue = True  # routed at once: it waits for the replica's 100
        elif size == _MODEL_ID_SIZE and name.lower() == _MODEL_ID:
            # the multiplexed model, spelled as the replica decodes it (routes the request)
            ex.model_id = value.decode("utf-8", "surrogateescape")
        ex.headers.append((name, value))

    def _check_length(self, ex: Exchange, value: bytes) -> None:
        """A declared body over the cap is refused before a byte of it is read."""
        cap = self.limits.max_body_bytes
        if cap is not None and value.strip().isdigit() and int(value) > cap:
            ex.refusal = (413, body_too_large(cap))

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        ex.method = parser.get_method()
        if ex.url[:1] != b"/":  # absolute-form (a client that takes us for a forward proxy)
            ex.url = origin_form(ex.url)
        ex.keep_alive = parser.should_keep_alive() and not self.state.leaving
        # Only HTTP/1.0 needs care, and a 1.0 request is never keep-alive without a Connection
        # header (which sets ``dropped``): the common case skips building the version string.
        if ex.dropped or not ex.keep_alive:
            ex.http10 = parser.get_http_version() == "1.0"
        # Upgrade and CONNECT: httptools stops parsing after this request (what follows is
        # another protocol). A WebSocket handshake goes on as a request (see upgraded); anything
        # else is answered 501 in its turn, the only answer it gets.
        if (ex.dropped or ex.method == _CONNECT) and parser.should_upgrade():
            if ex.method == _GET and not ex.http10 and is_websocket(ex.upgrade_to):
                ex.websocket()
                self.upgrading = ex
            else:
                ex.refusal = (501, b"%s is not supported by the proxy" % _upgrade_name(ex))
        ex.head_done = True
        limit = self.limits.max_header_bytes
        if self.clock.head_may_be_too_large(self.read_size) and _head_size(ex) > limit:
            ex.refusal = (431, head_too_large(limit))
        if ex.refusal is not None:
            ex.response_done = True  # a body that follows is read and dropped
        if ex is self.active:
            ex.start()

    def on_body(self, body: bytes) -> None:
        assert self.parsing is not None
        self.parsing.add_body(body)

    def on_message_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        self.parsing = None
        ex.request_done = True
        if ex.body_chunked and not ex.response_done:
            ex.pending.append(CHUNKED_END)
        if ex.unassigned:  # (only ever the active one) its body is whole: now a slot
            ex.assign()
        elif ex.response_done and ex is self.active:
            ex._finish()

    # -- driven by exchanges -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def writelines(self, data: list[bytes | bytearray]) -> None:
        if not self.closed:
            self.transport.writelines(data)

    def exchange_finished(self, ex: Exchange) -> None:
        """The active exchange ``ex`` is done both ways: keep alive (next request) or close."""
        if ex is not self.active:
            return
        self.active = None
        if not ex.keep_alive:
            self.close()
            return
        if self.pipeline:
            nxt = self.active = self.pipeline.popleft()
            if nxt.head_done:
                nxt.start()  # may answer and finish it at once, starting the one after
                if self.active is nxt:
                    nxt.pump()
        else:
            self.idle_since = self.loop.time()
        if not self.reading or self.upstream_write_paused:  # else nothing can have changed
            self.update_reading()

    def update_reading(self) -> None:
        """Read from the client unless something downstream asks us to hold back."""
        if self.closed:
            return
        active = self.active
        self.hold_reading(
            bool(self.pipeline)
            or self.upstream_write_paused
            or (active is not None and active.pending_bytes > _PENDING_HIGH_WATER)
        )

    def refuse(self, status: int, message: bytes) -> None:
        if self.upgrade_refused:  # the exchange answers 501; what follows is another protocol
            return
        ex = self.parsing
        rid = ex.request_id if ex is not None and ex.request_id else new_request_id()
        self.write(local_response(status, message, close=True, request_id=rid))
        self.close_lingering()

    def upgraded(self, rest: bytes) -> None:
        ex, self.upgrading = self.upgrading, None
        if ex is None or ex.response_done:
            # Answered (501, or a WebSocket refused already) by the exchange in its turn; what
            # follows would be a tunnel.
            self.upgrade_refused = True
            if not self.transport.is_closing():
                self.transport.pause_reading()
            return
        # A WebSocket handshake: the client end reads the connection from now on.
        self.transport.set_protocol(ClientEnd(self, ex, rest))

    def time_left(self, now: float) -> float | None:
        """Keep-alive timeout when idle, head and body timeouts while a request is arriving."""
        parsing = self.parsing
        if parsing is not None:
            remaining, late = self.clock.overdue(parsing.head_done, self.reading, now)
            if remaining <= 0:
                if parsing is self.active:
                    parsing.client_too_slow(late)
                else:
                    self.close()
                return None
            return remaining
        if self.active is None:
            return self.idle_time_left(now)
        # A response in progress: the request timeout, if any, is the exchange's own timer.
        return self.keep_alive_timeout_s


def _head_size(ex: Exchange) -> int:
    """Roughly the bytes of ``ex``'s request head (line and headers as parsed)."""
    return len(ex.method) + len(ex.url) + sum(len(n) + len(v) + 4 for n, v in ex.headers) + 12


def _upgrade_name(ex: Exchange) -> bytes:
    if ex.method == _CONNECT:
        return b"CONNECT (tunnelling)"
    if ex.upgrade_to:
        return b"upgrading to " + ex.upgrade_to[:64]
    return b"a protocol upgrade"
