"""The authenticated channel to replicas: every connection proves it belongs to the instance,
reaches the replica it meant to, and carries only authenticated bytes.

A replica runs the user's code and unpickles handle-call bodies, so nothing may reach it but the
instance's own processes. Every connection to a replica, over TCP or the same-host unix socket,
opens with a mutual handshake on a per-instance secret before a single HTTP byte is parsed:

    caller  -> replica   MAGIC (4) | role (1) | caller nonce (16) | id length (1) | replica id
    replica -> caller    replica nonce (16) | HMAC(secret, "server" | transcript) (32)
    caller  -> replica   HMAC(secret, "client" | transcript) (32), then sealed frames

    transcript = role | caller nonce | replica nonce | replica id

**Bound to the replica meant.** The caller names the replica it means to reach (its replica id:
the local backend's id, a pod's name on Kubernetes) and the replica refuses a greeting for any
other id. So a process squatting a dead replica's freed port cannot relay a caller's greeting to a
live replica and pass its proof off as the dead one's: the live replica refuses it, and a proof
names the replica that made it.

**Every byte after it authenticated.** Both ends derive a key per direction from the secret and
the transcript (:func:`session_keys`) and from then on exchange sealed frames
(:mod:`kubeserve.runtime.sealing`): a MAC per frame, sequence-numbered, so bytes injected,
altered, replayed or reordered by anything in the middle end the connection before they reach
HTTP parsing or unpickling.

The caller checks the replica's proof before it sends anything else, so a process squatting a
replica's address learns neither the secret nor a request; the replica checks the caller's proof
before it parses anything, so an unauthenticated peer is cut off after its greeting. The secret
never crosses the wire, and each proof is bound to both nonces, the role and the replica id, so no
proof can be replayed on another connection, for another role or for another replica.

The **role** decides what a connection may do, which keeps internal endpoints out of the
user-visible HTTP namespace entirely: on an ``INGRESS`` connection (a proxy forwarding client
traffic) every request is user traffic, whatever its path; on a ``CONTROL`` connection (handle
calls, the controller's health checks and reconfigure, the operator) every request is an internal
endpoint of :mod:`kubeserve.runtime.wire`. No path spelling can turn one into the other.

The handshake costs one round trip per new connection; connections are pooled and kept alive, so
requests pay only the frames' MACs (a keyed BLAKE2b per write, about a microsecond).

Where the secret comes from: ``KUBESERVE_DATA_PLANE_SECRET`` (a Kubernetes Secret, rendered as an
env var of the pod) or the file named by ``KUBESERVE_DATA_PLANE_SECRET_FILE`` (``kubeserve start``
writes one, mode 0600, into its state directory). :func:`take_secret` removes both variables from
the environment once read, so user code and its subprocesses do not inherit them.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import hmac
import logging
import os
import socket
import struct
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, TypeVar

from kubeserve.runtime import local_socket
from kubeserve.runtime.http1 import read_response
from kubeserve.runtime.sealing import SealedProtocol

if TYPE_CHECKING:  # a replica reads its secret from the environment: no pathlib there
    from pathlib import Path

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "SIGNATURE_HEADER",
    "ChannelError",
    "ReplayGuard",
    "Role",
    "ServerChannel",
    "ServerHandshake",
    "connect",
    "create_secret_file",
    "open_socket",
    "request",
    "session_keys",
    "sign_request",
    "take_secret",
    "verify_request",
]

SECRET_ENV = "KUBESERVE_DATA_PLANE_SECRET"
SECRET_FILE_ENV = "KUBESERVE_DATA_PLANE_SECRET_FILE"

MAGIC = b"KSC2"
_NONCE = 16
_MAC = 32
HELLO_SIZE = len(MAGIC) + 1 + _NONCE + 1  # then the replica id, up to MAX_IDENTITY bytes
#: The longest replica id a greeting may name (UTF-8 bytes).
MAX_IDENTITY = 255
CHALLENGE_SIZE = _NONCE + _MAC
PROOF_SIZE = _MAC
#: How long a replica waits for a connecting peer to finish the handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Shortest secret accepted: 128 bits.
MIN_SECRET_BYTES = 16


class ChannelError(ConnectionError):
    """The peer failed the handshake: wrong secret, not a kubeserve replica, or cut short."""


class Role(bytes, enum.Enum):
    """What a connection carries (see the module docstring)."""

    INGRESS = b"i"
    CONTROL = b"c"


def _transcript(role: bytes, caller: bytes, replica: bytes, identity: bytes) -> bytes:
    return role + caller + replica + len(identity).to_bytes(1, "big") + identity


def _proof(secret: bytes, label: bytes, transcript: bytes) -> bytes:
    return hmac.new(secret, label + transcript, hashlib.sha256).digest()


def session_keys(secret: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """The (caller-to-replica, replica-to-caller) frame keys of one connection."""
    return (
        _proof(secret, b"key:caller", transcript),
        _proof(secret, b"key:replica", transcript),
    )


def _identity_bytes(identity: str) -> bytes:
    raw = identity.encode("utf-8", "surrogateescape")
    if not 0 < len(raw) <= MAX_IDENTITY:
        raise ValueError(f"a replica id must be 1 to {MAX_IDENTITY} bytes: {identity!r}")
    return raw


# -- the secret ----------------------------------------------------------------------------------


def new_secret() -> str:
    return os.urandom(32).hex()  # secrets.token_hex's bytes, without importing it in replicas


def create_secret_file(path: Path) -> Path:
    """The instance's secret file at ``path``: created mode 0600 with a fresh secret when missing
    (an existing one is kept, so replicas that survive a restart keep talking to new proxies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        _parse_secret(path.read_text(), str(path))
        return path
    with os.fdopen(fd, "w") as out:
        out.write(new_secret() + "\n")
    return path


def take_secret(environ: MutableMapping[str, str] | None = None) -> bytes:
    """The data-plane secret from the environment (see the module docstring), removed from it.

    Raises :class:`ValueError` with what to fix when there is none or it is too short: a data-plane
    process never runs without one.
    """
    env = os.environ if environ is None else environ
    value = env.pop(SECRET_ENV, None)
    path = env.pop(SECRET_FILE_ENV, None)
    if value is not None:
        return _parse_secret(value, SECRET_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as source:
                text = source.read()
        except OSError as exc:
            raise ValueError(f"cannot read the data-plane secret {path}: {exc}") from exc
        return _parse_secret(text, path)
    raise ValueError(
        f"no data-plane secret: set {SECRET_ENV} or {SECRET_FILE_ENV} "
        "(kubeserve start and the operator set them for the processes they start)"
    )


def _parse_secret(text: str, where: str) -> bytes:
    secret = text.strip().encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the data-plane secret in {where} is shorter than {MIN_SECRET_BYTES} bytes"
        )
    return secret


# -- the caller's side ---------------------------------------------------------------------------


async def _handshake(
    sock: socket.socket, role: Role, secret: bytes, identity: str
) -> tuple[bytes, bytes]:
    """The caller's half; returns the connection's (send, receive) frame keys."""
    loop = asyncio.get_running_loop()
    caller = os.urandom(_NONCE)
    meant = _identity_bytes(identity)
    await loop.sock_sendall(
        sock, MAGIC + role.value + caller + len(meant).to_bytes(1, "big") + meant
    )
    challenge = b""
    while len(challenge) < CHALLENGE_SIZE:
        data = await loop.sock_recv(sock, CHALLENGE_SIZE - len(challenge))
        if not data:
            raise ChannelError(
                f"the peer closed the connection during the handshake (is it replica {identity}?)"
            )
        challenge += data
    replica, proof = challenge[:_NONCE], challenge[_NONCE:]
    transcript = _transcript(role.value, caller, replica, meant)
    if not hmac.compare_digest(proof, _proof(secret, b"server", transcript)):
        raise ChannelError(
            f"the peer is not replica {identity} of this instance (wrong handshake proof)"
        )
    await loop.sock_sendall(sock, _proof(secret, b"client", transcript))
    return session_keys(secret, transcript)


async def open_socket(
    host: str,
    port: int,
    role: Role,
    secret: bytes,
    identity: str,
    timeout_s: float | None = None,
) -> tuple[socket.socket, bool, tuple[bytes, bytes]]:
    """A socket to replica ``identity`` on ``host:port`` past the handshake, whether it is a unix
    socket (the replica's same-host socket when it has one, else TCP), and the connection's
    (send, receive) frame keys: every byte on it from now on is a sealed frame.

    Raises :class:`ChannelError` when the peer fails the handshake, ``OSError`` when it cannot be
    reached, ``TimeoutError`` after ``timeout_s``.
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        sock = local_socket.connect_socket(host, port)
        is_unix = sock is not None
        if sock is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (host, port))
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            keys = await _handshake(sock, role, secret, identity)
        except BaseException:
            sock.close()
            raise
    return sock, is_unix, keys


P = TypeVar("P", bound=asyncio.Protocol)


async def connect(
    factory: Callable[[], P],
    host: str,
    port: int,
    role: Role,
    secret: bytes,
    identity: str,
    timeout_s: float | None = None,
) -> P:
    """A protocol from ``factory`` connected to replica ``identity`` on ``host:port``, past the
    handshake (see :func:`open_socket`); its transport seals what it writes and it receives only
    bytes whose MAC verified."""
    sock, is_unix, (send, receive) = await open_socket(
        host, port, role, secret, identity, timeout_s
    )
    loop = asyncio.get_running_loop()
    protocol = factory()
    try:
        if is_unix:
            await loop.create_unix_connection(
                lambda: SealedProtocol(protocol, send, receive), sock=sock
            )
        else:
            await loop.create_connection(lambda: SealedProtocol(protocol, send, receive), sock=sock)
    except BaseException:
        sock.close()
        raise
    return protocol


class _ReaderProtocol(asyncio.StreamReaderProtocol):
    """A stream reader's protocol that keeps its transport where :func:`request` can write."""

    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        super().connection_made(transport)


async def request(
    host: str,
    port: int,
    method: str,
    path: str,
    secret: bytes,
    identity: str,
    body: bytes = b"",
    *,
    timeout_s: float = 30.0,
) -> tuple[int, bytes]:
    """One internal request on a fresh ``CONTROL`` connection to replica ``identity``:
    (status, body).

    For the controller's and the operator's occasional calls (readiness, health checks,
    reconfigure); the hot paths keep pooled connections instead.
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        protocol = await connect(
            lambda: _ReaderProtocol(reader, loop=loop), host, port, Role.CONTROL, secret, identity
        )
        transport = protocol.transport
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n"
            )
            if body:
                head += "Content-Type: application/json\r\n"
            transport.write(head.encode("latin-1") + b"\r\n" + body)
            return await read_response(reader, "replica")
        finally:
            transport.close()


# -- signed requests to the controller -----------------------------------------------------------

#: Header carrying :func:`sign_request`'s signature on requests to the local controller.
SIGNATURE_HEADER = "X-Kubeserve-Signature"
#: How far a signature's time may be from the receiver's clock.
SIGNATURE_MAX_SKEW_S = 60.0


def sign_request(secret: bytes, method: str, target: str, now: float) -> str:
    """A signature proving the data-plane secret for one request (``target`` is its path and
    query). The controller's discovery endpoint is plain HTTP on the admin port: the secret itself
    never goes over it, only this MAC, bound to the request and valid for a minute."""
    stamp = f"{now:.3f}"
    nonce = os.urandom(8).hex()
    mac = hmac.new(secret, f"{stamp}|{nonce}|{method}|{target}".encode(), hashlib.sha256)
    return f"{stamp}:{nonce}:{mac.hexdigest()}"


def verify_request(secret: bytes, signature: str, method: str, target: str, now: float) -> bool:
    """Whether ``signature`` (the :data:`SIGNATURE_HEADER` value) is :func:`sign_request`'s for
    this request, made within :data:`SIGNATURE_MAX_SKEW_S` of ``now``."""
    stamp, _, rest = signature.partition(":")
    nonce, _, mac = rest.partition(":")
    try:
        when = float(stamp)
    except ValueError:
        return False
    if not abs(now - when) <= SIGNATURE_MAX_SKEW_S:  # NaN never passes
        return False
    expected = hmac.new(secret, f"{stamp}|{nonce}|{method}|{target}".encode(), hashlib.sha256)
    return hmac.compare_digest(mac.encode(), expected.hexdigest().encode())


class ReplayGuard:
    """Signatures already accepted, so a captured signed request cannot be replayed while its
    time is still within :data:`SIGNATURE_MAX_SKEW_S`.

    Holds a signature until its stamp is out of the window (then :func:`verify_request` refuses it
    anyway). Only signatures that verified are recorded, so its size is bounded by what the
    instance's own processes sign in two minutes; past ``capacity`` it refuses new ones (fails
    closed) rather than forget one still replayable.
    """

    __slots__ = ("_capacity", "_expiry", "_seen")

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._seen: set[str] = set()
        self._expiry: collections.deque[tuple[float, str]] = collections.deque()

    def first_use(self, signature: str, now: float) -> bool:
        """Whether ``signature`` (one that verified) is seen for the first time; records it."""
        expiry, seen = self._expiry, self._seen
        while expiry and expiry[0][0] < now:
            seen.discard(expiry.popleft()[1])
        if signature in seen or len(seen) >= self._capacity:
            return False
        stamp = float(signature.partition(":")[0])
        seen.add(signature)
        expiry.append((max(stamp, now) + SIGNATURE_MAX_SKEW_S, signature))
        return True


# -- the replica's side --------------------------------------------------------------------------


class ServerHandshake:
    """The replica's half of the handshake, fed the first bytes of a connection.

    :meth:`feed` returns ``None`` while more bytes are needed, raises :class:`ChannelError` when
    the peer failed (or meant another replica), and once the peer proved itself returns the bytes
    that followed its proof (its first sealed frames); :attr:`role` then says what the connection
    may carry and :attr:`keys` are its (send, receive) frame keys.
    """

    __slots__ = ("_buffer", "_identity", "_secret", "_transcript", "_write", "keys", "role")

    def __init__(self, secret: bytes, identity: str, write: Callable[[bytes], object]) -> None:
        self._secret = secret
        self._identity = _identity_bytes(identity)
        self._write = write
        self._buffer = b""
        self._transcript = b""
        self.role: Role | None = None
        self.keys: tuple[bytes, bytes] = (b"", b"")

    def feed(self, data: bytes) -> bytes | None:
        buffer = self._buffer + data
        if not self._transcript:
            if not MAGIC.startswith(buffer[: len(MAGIC)]):
                raise ChannelError("not a kubeserve channel (bad greeting)")
            if len(buffer) < HELLO_SIZE:
                self._buffer = buffer
                return None
            hello_end = HELLO_SIZE + buffer[HELLO_SIZE - 1]
            if len(buffer) < hello_end:
                self._buffer = buffer
                return None
            hello, buffer = buffer[:hello_end], buffer[hello_end:]
            try:
                self.role = Role(hello[len(MAGIC) : len(MAGIC) + 1])
            except ValueError:
                raise ChannelError("unknown channel role") from None
            caller = hello[len(MAGIC) + 1 : len(MAGIC) + 1 + _NONCE]
            meant = hello[HELLO_SIZE:]
            if not hmac.compare_digest(meant, self._identity):
                raise ChannelError(
                    f"the caller meant replica {meant.decode('utf-8', 'replace')!r}, "
                    f"this is {self._identity.decode('utf-8', 'replace')!r}"
                )
            replica = os.urandom(_NONCE)
            self._transcript = _transcript(self.role.value, caller, replica, meant)
            self._write(replica + _proof(self._secret, b"server", self._transcript))
        if len(buffer) < PROOF_SIZE:
            self._buffer = buffer
            return None
        expected = _proof(self._secret, b"client", self._transcript)
        if not hmac.compare_digest(buffer[:PROOF_SIZE], expected):
            raise ChannelError("the caller failed the handshake (wrong secret)")
        self._buffer = b""
        receive, send = session_keys(self._secret, self._transcript)
        self.keys = (send, receive)
        return buffer[PROOF_SIZE:]


class ServerChannel(asyncio.Protocol):
    """The protocol a replica's listener starts every connection with: runs the handshake, then
    becomes the connection's :class:`~kubeserve.runtime.sealing.SealedProtocol` around the
    protocol ``make(role)`` returns for the role the caller proved.

    A peer that fails the handshake, or does not finish it within :data:`HANDSHAKE_TIMEOUT_S`,
    is cut off and logged; nothing it sent reaches ``make``'s protocol.
    """

    def __init__(
        self,
        secret: bytes,
        identity: str,
        make: Callable[[Role], asyncio.Protocol],
        log: logging.Logger,
    ) -> None:
        self._make = make
        self._log = log
        self._transport: asyncio.Transport | None = None
        self._handshake: ServerHandshake | None = None
        self._secret = secret
        self._identity = identity
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._handshake = ServerHandshake(self._secret, self._identity, transport.write)  # type: ignore[attr-defined]
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._expired)

    def data_received(self, data: bytes) -> None:
        handshake, transport = self._handshake, self._transport
        assert handshake is not None and transport is not None
        try:
            rest = handshake.feed(data)
        except ChannelError as exc:
            self._refuse(str(exc))
            return
        if rest is None:
            return
        self._handshake = None
        if self._timer is not None:
            self._timer.cancel()
        assert handshake.role is not None
        send, receive = handshake.keys
        sealed = SealedProtocol(self._make(handshake.role), send, receive, rest)
        transport.set_protocol(sealed)
        sealed.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expired(self) -> None:
        if self._handshake is not None:
            self._refuse(f"no handshake within {HANDSHAKE_TIMEOUT_S:.0f} s")

    def _refuse(self, why: str) -> None:
        transport = self._transport
        assert transport is not None
        self._handshake = None
        if not transport.is_closing():
            self._log.warning("refused a connection from %s: %s", peer_description(transport), why)
            transport.abort()


def peer_description(transport: asyncio.BaseTransport) -> str:
    """Who is on the other end, for log lines about refused connections."""
    peer = transport.get_extra_info("peername")
    if peer:
        return str(peer[0]) if isinstance(peer, tuple) else str(peer) or "unix socket"
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _ = struct.unpack("3i", creds)
            return f"unix socket (pid {pid}, uid {uid})"
        except OSError:
            return "unix socket"
    return "unknown peer"
