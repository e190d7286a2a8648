"""Server-side TLS over a plain event-loop transport: the proxy's HTTPS connections.

Why not the event loop's own TLS (``create_server(ssl=...)``): with uvloop's ``SSLProtocol``, TLS
added about 32 us of the proxy's CPU to a keep-alive request, with this about 18 us (measured by
``benchmarks/tls.py``, see benchmarks/README.md): there each read is decrypted into a fresh
256 KiB buffer, every write goes through a backlog list and flow control bookkeeping, and
``writelines`` seals each piece as a TLS record of its own. Here a read
is decrypted record by record into bytes of the record's size and handed on in one
``data_received``; a ``write`` or ``writelines`` is sealed at once, as one record (up to 16 KiB),
and its ciphertext handed to the plain transport in one write. Flow control is the plain
transport's: its write buffer holds the ciphertext, its ``pause_writing`` and ``resume_writing``
reach the protocol above unchanged, and pausing reading pauses the socket.

The kernel cannot do it here (kTLS): it needs the ``tls`` module (``CONFIG_TLS``), Python 3.11's
``ssl`` has no ``OP_ENABLE_KTLS``, and OpenSSL 3.0 hands only TLS 1.2 receive keys to the kernel
while clients speak TLS 1.3.

:class:`TLSServerProtocol` is the plain transport's protocol: it runs the handshake (aborted
after ``handshake_timeout_s``), then calls the protocol above's ``connection_made`` with its
:class:`TLSTransport`. Failed handshakes (a client that does not trust the certificate, plain HTTP
on the HTTPS port, no client certificate where one is required) close the connection, as the
event loop's TLS does, logged at debug level: they are the client's mistake.

Closing sends ``close_notify`` and closes the socket once the ciphertext is written, without
waiting for the peer's (as nginx and uvicorn behind uvloop do in effect); the peer's
``close_notify`` is an end of stream for the protocol above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from kubeserve.runtime.layered_transport import LayeredTransport

__all__ = ["HANDSHAKE_TIMEOUT_S", "TLSServerProtocol", "TLSTransport"]

log = logging.getLogger(__name__)

#: how long a client may take over its handshake (the event loop's default)
HANDSHAKE_TIMEOUT_S = 60.0
#: the largest plaintext of one TLS record: one ``read`` never returns more
_RECORD = 16384
_WANT_READ = ssl.SSLWantReadError


class TLSServerProtocol(asyncio.Protocol):
    """The plain transport's protocol: the handshake, then decryption for ``app``.

    Invariant: ``transport`` is ``None`` until the handshake completed; from then on ``app`` has
    had its ``connection_made(transport)`` and gets every byte the client sends, decrypted.
    """

    __slots__ = (
        "_closed_by_peer",
        "_incoming",
        "_outgoing",
        "_raw",
        "_ssl",
        "_timer",
        "app",
        "context",
        "handshake_timeout_s",
        "transport",
    )

    def __init__(
        self,
        context: ssl.SSLContext,
        app: asyncio.Protocol,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.context = context
        self.app = app
        self.handshake_timeout_s = handshake_timeout_s
        self.transport: TLSTransport | None = None
        self._raw: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl: ssl.SSLObject = None  # type: ignore[assignment]  # set on connect
        self._timer: asyncio.TimerHandle | None = None
        self._closed_by_peer = False

    # -- the plain transport's protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]  # a stream transport
        self._ssl = self.context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._timer = asyncio.get_running_loop().call_later(
            self.handshake_timeout_s, self._handshake_timed_out
        )

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and transport.closing:
            return  # closed by the protocol above: nothing more is read, as on a plain transport
        self._incoming.write(data)
        if transport is None and not self._handshake():
            return
        tls = self._ssl
        try:
            plain = tls.read(_RECORD)
            # A read returns one record's plaintext, whole when shorter than the largest: more is
            # pending only behind it in the BIO (``pending()``, a call, is asked only if full).
            if plain and (self._incoming.pending or len(plain) == _RECORD):
                plain = self._read_more(plain)
        except _WANT_READ:  # a record not whole yet
            self._flush()
            return
        except ssl.SSLError as exc:
            self.fail(exc)
            return
        if self._outgoing.pending:  # a post-handshake answer (a key update)
            self._flush()
        if plain:
            self.app.data_received(plain)
        if not plain or self._closed_by_peer:  # the client's close_notify
            self._end_of_stream()

    def _read_more(self, first: bytes) -> bytes:
        """The plaintext of every whole record read, after ``first`` (one read's worth)."""
        tls = self._ssl
        parts = [first]
        try:
            while self._incoming.pending or tls.pending():
                part = tls.read(_RECORD)
                if not part:  # close_notify behind the data
                    self._closed_by_peer = True
                    break
                parts.append(part)
        except _WANT_READ:
            pass
        return b"".join(parts)

    def eof_received(self) -> bool | None:
        if self.transport is None:
            return None
        return self.app.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.closing = True
            self.app.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.app.resume_writing()

    # -- internals ---------------------------------------------------------------------------------

    def _handshake(self) -> bool:
        """Advance the handshake; ``True`` once it completed (the app is connected)."""
        try:
            self._ssl.do_handshake()
        except _WANT_READ:
            self._flush()
            return False
        except (ssl.SSLError, ssl.CertificateError) as exc:
            log.debug("TLS handshake with %s failed: %s", self._peer(), exc)
            self._flush()  # the alert, if any
            self._cancel_timer()
            self._raw.close()
            return False
        self._cancel_timer()
        self._flush()  # the session tickets
        self.transport = TLSTransport(self, self._raw, self._ssl, self._outgoing)
        self.app.connection_made(self.transport)
        return not self._raw.is_closing()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.transport is None:
            log.debug("TLS handshake with %s timed out", self._peer())
            self._raw.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        if self._outgoing.pending:
            self._raw.write(self._outgoing.read())

    def fail(self, exc: ssl.SSLError) -> None:
        """A broken connection (a bad record, an alert): the alert we owe, then abort."""
        log.debug("TLS connection with %s failed: %s", self._peer(), exc)
        self._flush()
        assert self.transport is not None
        self.transport.abort()

    def _end_of_stream(self) -> None:
        assert self.transport is not None
        if not self.app.eof_received():
            self.transport.close()

    def _peer(self) -> str:
        peer = self._raw.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "a client"


class TLSTransport(LayeredTransport):
    """What the protocol above writes to: each write sealed at once, the rest the plain
    transport's."""

    __slots__ = ("_outgoing", "_protocol", "_ssl", "closing")

    def __init__(
        self,
        protocol: TLSServerProtocol,
        raw: asyncio.Transport,
        tls: ssl.SSLObject,
        outgoing: ssl.MemoryBIO,
    ) -> None:
        super().__init__(raw)
        self._protocol = protocol
        self._ssl = tls
        self._outgoing = outgoing
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data:
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError as exc:  # the connection failed already (an alert from the client)
            self._protocol.fail(exc)
            return
        self._raw.write(self._outgoing.read())

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))  # one TLS record, not one per piece

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        with contextlib.suppress(ssl.SSLError):
            self._ssl.unwrap()  # writes our close_notify; the peer's is not waited for
        if self._outgoing.pending:
            self._raw.write(self._outgoing.read())
        self._raw.close()

    def abort(self) -> None:
        self.closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self.closing or self._raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._ssl
        match name:
            case "ssl_object":
                return tls
            case "sslcontext":
                return tls.context
            case "peercert":
                return tls.getpeercert()
            case "cipher":
                return tls.cipher()
            case "compression":
                return tls.compression()
        return super().get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol.app = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol.app
