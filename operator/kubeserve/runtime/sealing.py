"""Sealed frames: every byte after the channel handshake carries a MAC.

The handshake of :mod:`kubeserve.runtime.channel` proves who is at each end; without more, a
process in the middle of a connection (a relay squatting a dead replica's port, anything on the
pod network) could let the handshake pass and then inject or rewrite the bytes after it, for
example a pickle the caller would load. So from the handshake on, both directions are framed::

    length (4, big-endian) | payload (length bytes) | tag (16)
    tag = MAC(direction key, sequence number (8) | length (4) | payload), 16 bytes
    MAC = keyed BLAKE2b for payloads up to 1 KiB, HMAC-SHA256 above (each with its own subkey)

Each direction has its own key, derived from the instance's secret and both handshake nonces
(:func:`kubeserve.runtime.channel.session_keys`), so a frame cannot be moved to another
connection or reflected back; the implicit sequence number (never sent, counted by both ends)
means a frame cannot be dropped, repeated or reordered without the next tag failing. A tag that
does not verify ends the connection before a byte of its frame is delivered: the protocol above
only ever sees authenticated bytes. The payload is not encrypted (the traffic was plain HTTP
before; authenticity is what keeps user code and the caller safe).

:class:`SealedProtocol` sits between an asyncio transport and the protocol that speaks HTTP over
it, and hands that protocol a :class:`SealedTransport`: the HTTP code on both sides is unchanged.
One write is one frame (writes over :data:`MAX_FRAME` are split); a frame announced longer than
that ends the connection, which bounds what a peer can make us buffer.

Why two MACs, chosen by the (authenticated) length: keyed BLAKE2b is a MAC by design and the
cheapest of the standard library's on small frames, which is what most requests and answers are
(about half of HMAC-SHA256's cost at 200 bytes); above a few KiB, HMAC-SHA256 runs on the CPU's
SHA instructions and costs under half of BLAKE2b (``benchmarks/channel_mac.py`` measures both).
Both ends derive each subkey from the direction key, so no key serves two algorithms.

:class:`Sealer`, :class:`Opener` and :class:`FrameError` are ``kubeserve._native``'s when the
extension is built (:mod:`kubeserve.runtime.native_module`: the proxy's Rust frames, a third of
the Python classes' CPU per frame), else :class:`PySealer`, :class:`PyOpener` and
:class:`PyFrameError`: same frames, same errors, both tested against each other.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Iterable
from typing import Any

from kubeserve.runtime.layered_transport import LayeredTransport
from kubeserve.runtime.native_module import NATIVE

__all__ = [
    "MAX_FRAME",
    "OPENS_REQUESTS",
    "TAG_SIZE",
    "FrameError",
    "Opener",
    "PyFrameError",
    "PyOpener",
    "PySealer",
    "SealedProtocol",
    "SealedTransport",
    "Sealer",
    "frame_failed",
]

log = logging.getLogger("kubeserve.channel")

#: The largest payload of one frame; longer writes become several frames.
MAX_FRAME = 256 * 1024
TAG_SIZE = 16
_HEAD = 4


class PyFrameError(ConnectionError):
    """A frame failed to verify or was malformed: the connection is not trustworthy any more."""


#: Payloads up to this size are tagged with keyed BLAKE2b, larger ones with HMAC-SHA256.
SMALL_FRAME = 1024

try:  # the C HMAC object, whose copy() skips the Python wrapper of hmac.HMAC
    from _hashlib import hmac_new as _hmac_new
except ImportError:  # pragma: no cover - a Python without OpenSSL's HMAC
    _hmac_new = None  # type: ignore[assignment]


class _Tagger:
    """The 16-byte tag of (``prefix``, ``payload``) under one direction key."""

    __slots__ = ("_large", "_small")

    def __init__(self, key: bytes) -> None:
        small = hashlib.blake2b(key + b"|small", digest_size=32).digest()
        large = hashlib.blake2b(key + b"|large", digest_size=32).digest()
        self._small = hashlib.blake2b(key=small, digest_size=TAG_SIZE)
        self._large: Any = (
            _hmac_new(large, digestmod="sha256")
            if _hmac_new is not None
            else hmac.new(large, digestmod=hashlib.sha256)
        )

    def tag(self, prefix: bytes, payload: bytes | memoryview) -> bytes:
        """``prefix`` is the frame's sequence number (8 bytes) and length (4)."""
        if len(payload) <= SMALL_FRAME:
            mac = self._small.copy()
            mac.update(prefix)
            mac.update(payload)
            return mac.digest()
        mac = self._large.copy()
        mac.update(prefix)
        mac.update(payload)
        return mac.digest()[:TAG_SIZE]  # type: ignore[no-any-return]


class PySealer:
    """The sending half of one direction: numbers and seals each payload it is given."""

    __slots__ = ("_seq", "_tag")

    def __init__(self, key: bytes) -> None:
        self._tag = _Tagger(key).tag
        self._seq = 0

    def seal(self, payload: bytes | bytearray | memoryview) -> bytes:
        """The frames of ``payload`` (one, or several past :data:`MAX_FRAME` bytes; none for an
        empty payload)."""
        if type(payload) is not bytes:
            payload = bytes(payload)
        size = len(payload)
        if size > MAX_FRAME:
            return b"".join(
                self.seal(payload[start : start + MAX_FRAME]) for start in range(0, size, MAX_FRAME)
            )
        if not size:
            return b""
        seq = self._seq
        self._seq = seq + 1
        prefix = ((seq << 32) | size).to_bytes(12, "big")  # sequence number | length
        return b"".join((prefix[8:], payload, self._tag(prefix, payload)))

    def seal_parts(self, parts: Iterable[bytes | bytearray | memoryview]) -> bytes:
        """:meth:`seal` of the concatenation of ``parts``."""
        return self.seal(b"".join(parts))


class PyOpener:
    """The receiving half of one direction: fed what arrives, returns the verified payloads."""

    __slots__ = ("_buffer", "_seq", "_tag")

    def __init__(self, key: bytes) -> None:
        self._tag = _Tagger(key).tag
        self._buffer = b""
        self._seq = 0

    def feed(self, data: bytes) -> bytes:
        """The payload bytes completed by ``data`` (``b""`` while a frame is partial); raises
        :class:`PyFrameError` on a tag that does not verify or an oversized frame."""
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        size = len(data)
        if size >= _HEAD:
            length = int.from_bytes(data[:_HEAD], "big")
            if size == _HEAD + length + TAG_SIZE:  # the usual case: one whole frame per read
                return self._open(data, 0, length)
        out = []
        start = 0
        while size - start >= _HEAD:
            length = int.from_bytes(data[start : start + _HEAD], "big")
            end = start + _HEAD + length + TAG_SIZE
            if end > size:
                break
            out.append(self._open(data, start, length))
            start = end
        if start < size:
            if size - start >= _HEAD and not length <= MAX_FRAME:
                raise PyFrameError(f"a frame of {length} bytes (the limit is {MAX_FRAME})")
            self._buffer = data[start:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _open(self, data: bytes, start: int, length: int) -> bytes:
        if length > MAX_FRAME:
            raise PyFrameError(f"a frame of {length} bytes (the limit is {MAX_FRAME})")
        body = start + _HEAD
        payload = data[body : body + length]
        tag = self._tag(((self._seq << 32) | length).to_bytes(12, "big"), payload)
        if not hmac.compare_digest(tag, data[body + length : body + length + TAG_SIZE]):
            raise PyFrameError("a frame failed its MAC (altered, replayed or injected bytes)")
        self._seq += 1
        return payload


if NATIVE is not None:
    FrameError: type[ConnectionError] = NATIVE.FrameError
    Sealer: type[PySealer] = NATIVE.Sealer
    Opener: type[PyOpener] = NATIVE.Opener
else:
    FrameError = PyFrameError
    Sealer = PySealer
    Opener = PyOpener


def frame_failed(transport: asyncio.BaseTransport, exc: Exception) -> None:
    """A frame did not verify (or was oversized): log it and drop the connection at once."""
    log.warning(
        "closed a data-plane connection with %s: %s",
        transport.get_extra_info("peername") or "a unix socket peer",
        exc,
    )
    transport.abort()  # type: ignore[attr-defined]


#: Whether the sealing classes can serve a protocol that opens its frames itself (see
#: :meth:`SealedProtocol.connection_made`): the compiled ones' ``Opener.feed_requests`` and
#: ``feed_answer``, and ``Sealer.seal_answer``.
OPENS_REQUESTS = (
    hasattr(Opener, "feed_requests")
    and hasattr(Opener, "feed_answer")
    and hasattr(Sealer, "seal_answer")
)


class SealedTransport(LayeredTransport):
    """What the protocol above sees: writes are sealed into frames, the rest is the raw
    transport's. ``sealer`` seals them (a protocol above may seal into it too, in order with
    these writes: one sequence of frames)."""

    __slots__ = ("_channel", "_seal", "_seal_parts", "sealer")

    def __init__(self, raw: asyncio.Transport, key: bytes, channel: SealedProtocol) -> None:
        super().__init__(raw)
        sealer = self.sealer = Sealer(key)
        self._seal = sealer.seal
        self._seal_parts = sealer.seal_parts
        self._channel = channel

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self._raw.write(self._seal(data))

    def writelines(self, list_of_data: Any) -> None:
        frames = self._seal_parts(list_of_data)
        if frames:
            self._raw.write(frames)

    def write_eof(self) -> None:
        raise NotImplementedError("a sealed channel has no half-close")

    def close(self) -> None:
        self._raw.close()

    def abort(self) -> None:
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._channel.inner = protocol  # type: ignore[assignment]
        if self._raw.get_protocol() is not self._channel:  # the inner one opened frames itself
            self._raw.set_protocol(self._channel)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._channel.inner


class SealedProtocol(asyncio.Protocol):
    """The raw transport's protocol once a handshake passed: opens frames for ``inner`` and hands
    it a :class:`SealedTransport` for its writes.

    ``pending`` are bytes that arrived with the end of the handshake (the first frames).

    An ``inner`` protocol with ``opens_frames`` (the replica's HTTP connection) may take the
    frames straight from the raw transport instead, with this protocol's opener (one hop and a
    copy less per read on the replica's hot path): ``opens_frames(opener, raw)`` returns whether
    it does; the raw transport then calls it directly, until its transport's ``set_protocol``
    hands the frames back to this protocol."""

    __slots__ = ("_opener", "_send_key", "inner", "pending", "transport")

    def __init__(
        self, inner: asyncio.Protocol, send_key: bytes, receive_key: bytes, pending: bytes = b""
    ) -> None:
        self.inner = inner
        self._send_key = send_key
        self._opener = Opener(receive_key)
        self.pending = pending
        self.transport: SealedTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = SealedTransport(raw, self._send_key, self)
        inner = self.inner
        inner.connection_made(self.transport)
        opens_frames = getattr(inner, "opens_frames", None) if OPENS_REQUESTS else None
        receive = self.data_received
        if opens_frames is not None and opens_frames(self._opener, raw):
            raw.set_protocol(inner)
            receive = inner.data_received
        pending, self.pending = self.pending, b""
        if pending:
            receive(pending)

    def data_received(self, data: bytes) -> None:
        try:
            plain = self._opener.feed(data)
        except FrameError as exc:
            assert self.transport is not None
            frame_failed(self.transport, exc)
            return
        if plain:
            self.inner.data_received(plain)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
