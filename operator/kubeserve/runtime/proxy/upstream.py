"""The proxy's side of a connection to a replica: parses its responses, streams them to the client.

Responses go out verbatim when they can (a whole response in one read, nothing to change), else as
the pieces httptools hands over, hop-by-hop headers dropped and chunked bodies re-framed; what one
read produced leaves in one ``writelines``. A replica's 503 marked unserved
(:data:`~kubeserve.runtime.wire.UNSERVED_HEADER`) never reaches the client: the exchange sends its
request to another replica. The models a replica names in its answer to a multiplexed request
(:data:`~kubeserve.runtime.wire.MODELS_HEADER`) go to the router, not to the client. A ``101`` to
a WebSocket handshake is relayed with its upgrade headers, and the connection is handed to the
exchange's tunnel (:mod:`.tunnel`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httptools

from kubeserve.runtime.http1 import (
    CHUNKED_END,
    HOP_OR_CHUNKED_NAME_LENGTHS,
    REQUEST_ID,
    HeaderKind,
    chunk_prefix,
    classify_header,
)
from kubeserve.runtime.keepalive import KeepAliveConnection
from kubeserve.runtime.wire import MODELS_HEADER, UNSERVED_AT_CAPACITY, UNSERVED_HEADER

if TYPE_CHECKING:
    from kubeserve.runtime.proxy.exchange import Exchange
    from kubeserve.runtime.proxy.state import UpstreamPool

__all__ = ["UpstreamConnection"]

_UNSERVED = UNSERVED_HEADER.encode()
_AT_CAPACITY = UNSERVED_AT_CAPACITY.encode()
_MODELS = MODELS_HEADER.encode()
_MODELS_SIZE = len(_MODELS)
_CRLF = b"\r\n"
_HEAD = b"HEAD"
_CONNECTION_CLOSE = b"Connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_UPGRADE_WEBSOCKET = b"Connection: Upgrade\r\nUpgrade: websocket\r\n"


class UpstreamConnection(KeepAliveConnection):
    """One keep-alive connection to a replica; parses its responses and streams them to a client.

    Invariant: ``exchange`` is set while a request is on this connection and ``None`` while the
    connection idles in its pool; one request at a time (no upstream pipelining). ``out`` collects
    what the current read produced for the client; a response head that may go out verbatim is
    not serialized (``head_deferred``) until the end of the read shows whether it must be.
    """

    def __init__(self, pool: UpstreamPool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.out: list[bytes | bytearray] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.reason = b""
        self.extra = b""  # a Connection header of our own for the client
        self.dropped = False  # a hop-by-hop header of the replica's was dropped
        self.has_id = False  # the response carries X-Request-Id
        self.unserved = False  # a 503 saying the replica never started the request
        self.at_capacity = False  # ... because it runs max_ongoing_requests already
        self.in_message = False
        self.fresh = False  # the current read started between two responses
        self.begun = 0  # responses begun in the current read
        self.head_deferred = False
        self.chunked = False
        self.until_close = False
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.reset_parser = False
        self.switching = False  # a 101 to a WebSocket handshake

    def close(self) -> None:
        self.exchange = None
        super().close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # nothing was asked: a confused replica; never reuse this connection
            self.pool.discard(self)
            self.close()
            return
        self.fresh = not self.in_message
        self.begun = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._serialize_head()
            self._flush(ex)
            self._lost(ex)
            return
        except httptools.HttpParserUpgrade as exc:  # a 101: what follows is another protocol
            if not self.switching:  # to a request that asked for no upgrade: a confused replica
                self.out.clear()
                self._lost(ex)
                return
            self._flush(ex)
            ex.upgrade_accepted(self, data[exc.args[0] :])
            return
        if self.unserved:  # not for the client: the request goes to another replica
            if self.complete:
                self.unserved = self.complete = False
                self.out.clear()
                self.exchange = None
                self.pool.discard(self)
                self.close()
                ex.retry_unserved(self.at_capacity)
            return
        if self.head_deferred:
            if self.complete and self.begun == 1 and data.startswith(b"HTTP/1.1 "):
                # Verbatim: the read held this one response from its first byte to its last (a
                # byte more would have begun another, or failed the parse): send it as read.
                self.head_deferred = False
                self.out.clear()
                ex.client.write(data)
            else:
                self._serialize_head()
        # Write coalescing: one writelines for everything this read produced.
        self._flush(ex)
        if self.reset_parser:  # a HEAD response: the parser would wait for a body that never comes
            self.parser = httptools.HttpResponseParser(self)
            self.reset_parser = False
        if self.complete:
            self.complete = False
            ex.response_complete(self.keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        ex = self.exchange
        self.exchange = None
        if ex is not None:
            if self.until_close and ex.response_started:
                ex.response_complete(False)  # a body delimited by the connection closing
            else:
                self._lost(ex)

    def pause_writing(self) -> None:
        # The replica reads the request body slower than the client sends it.
        ex = self.exchange
        if ex is not None:
            ex.client.upstream_write_paused = True
            ex.client.update_reading()

    def resume_writing(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.client.upstream_write_paused = False
            ex.client.update_reading()

    def _flush(self, ex: Exchange) -> None:
        if self.out:
            ex.client.writelines(self.out)
            self.out.clear()

    def _head(self) -> bytes:
        """The status line and headers for the client: the replica's, minus hop-by-hop ones, plus
        our own Connection header when the client needs one."""
        lines = [b"HTTP/1.1 %d %s\r\n" % (self.status, self.reason)]
        lines += [b"%s: %s\r\n" % header for header in self.headers]
        lines += (self.extra, _CRLF)
        return b"".join(lines)

    def _serialize_head(self) -> None:
        """A deferred head goes out after all: in front of the body pieces of this read."""
        if self.head_deferred:
            self.head_deferred = False
            self.out.insert(0, self._head())

    def _lost(self, ex: Exchange) -> None:
        self.exchange = None
        if not self.closed:
            self.closed = True
            self.transport.abort()
        if ex.response_started:
            ex.upstream_lost_mid_response()
        else:
            ex.upstream_failed(written=True)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
        self.in_message = True
        self.headers = []
        self.reason = self.extra = b""
        self.chunked = self.until_close = self.interim = self.dropped = self.has_id = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # Most names cannot be special: one len() spares the call (see classify_header).
        # Content-Length is not looked at here; on_headers_complete asks only when it matters.
        size = len(name)
        if size in HOP_OR_CHUNKED_NAME_LENGTHS:
            kind = classify_header(name, value)
            if kind == HeaderKind.HOP_BY_HOP:
                self.dropped = True
                return
            if kind == HeaderKind.CHUNKED:
                self.chunked = True
        elif size == 12 and name[0] | 0x20 == 0x78 and name.lower() == REQUEST_ID:
            self.has_id = True  # (0x78: "x"; Content-Type is the usual other 12-letter name)
        elif size == _MODELS_SIZE and name.lower() == _MODELS:
            self.dropped = True  # for the router only: the head is written without it
            ex = self.exchange
            if ex is not None and ex.model_id and ex.replica is not None:
                ex.client.state.router.note_models(ex.replica, value)
            return
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        self.status = status = self.parser.get_status_code()
        if status == 101 and ex.upgrade:  # the replica accepted a WebSocket: relayed as is
            ex.response_started = self.switching = True
            self.extra = _UPGRADE_WEBSOCKET
            if not self.has_id and ex.request_id:
                self.extra += b"x-request-id: %s\r\n" % ex.request_id
            self.out.append(self._head())
            return
        if 100 <= status < 200:  # interim (100 Continue): relayed, the real response follows
            self.interim = True
            self.out.append(self._head())
            return
        if status == 503 and ex.raw is not None and ex.request_done and self._unserved():
            self.unserved = True  # held whole and never started: data_received re-sends it
            self.at_capacity = self._unserved_reason() == _AT_CAPACITY
            return
        ex.response_started = True
        no_body = ex.method == _HEAD or status in (204, 304)
        # A body that ends with the connection: neither chunked nor sized. httptools says "keep
        # alive" only for delimited bodies, so the common case never scans the headers.
        self.until_close = not (
            no_body or self.chunked or self.parser.should_keep_alive() or self._has_length()
        )
        if self.until_close:
            ex.keep_alive = False  # the client learns where the body ends by the close, too
        if not ex.keep_alive:
            self.extra = _CONNECTION_CLOSE
        elif ex.http10:
            self.extra = _CONNECTION_KEEP_ALIVE
        if not self.has_id and ex.request_id:  # kubeserve replicas echo it; others may not
            self.extra += b"x-request-id: %s\r\n" % ex.request_id
        if self.fresh and self.begun == 1 and not (self.dropped or self.extra or no_body):
            self.head_deferred = True  # perhaps verbatim: data_received decides
        else:
            self.out.append(self._head())
        if ex.method == _HEAD:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
            self.reset_parser = True

    def _unserved(self) -> bool:
        return any(name.lower() == _UNSERVED for name, _ in self.headers)

    def _unserved_reason(self) -> bytes:
        return next((value for name, value in self.headers if name.lower() == _UNSERVED), b"")

    def _has_length(self) -> bool:
        return any(
            classify_header(name, value) == HeaderKind.LENGTH for name, value in self.headers
        )

    def on_body(self, body: bytes) -> None:
        if self.unserved:
            return
        if self.chunked:
            self.out += (chunk_prefix(len(body)), body, _CRLF)
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self.interim:
            self.interim = False
            return
        if self.chunked:
            self.out.append(CHUNKED_END)
        self.complete = True
        # Read here: once the message is over, httptools answers False whatever the headers said.
        self.keep_alive = self.parser.should_keep_alive() and not self.until_close
