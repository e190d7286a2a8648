"""The authenticated channel to replicas: every connection proves it belongs to the instance.

A replica runs the user's code and unpickles handle-call bodies, so nothing may reach it but the
instance's own processes. Every connection to a replica, over TCP or the same-host unix socket,
opens with a mutual handshake on a per-instance secret before a single HTTP byte is parsed:

    caller  -> replica   MAGIC (4) | role (1) | caller nonce (16)
    replica -> caller    replica nonce (16) | HMAC(secret, "server" | role | nonces) (32)
    caller  -> replica   HMAC(secret, "client" | role | nonces) (32), then HTTP/1.1 as usual

The caller checks the replica's proof before it sends anything else, so a process squatting a
replica's address (a freed TCP port, a unix socket name) learns neither the secret nor a request;
the replica checks the caller's proof before it parses anything, so an unauthenticated peer is cut
off after 21 bytes. The secret never crosses the wire, and each proof is bound to both nonces and
to the role, so no proof can be replayed on another connection or for another role.

The **role** decides what a connection may do, which keeps internal endpoints out of the
user-visible HTTP namespace entirely: on an ``INGRESS`` connection (a proxy forwarding client
traffic) every request is user traffic, whatever its path; on a ``CONTROL`` connection (handle
calls, the controller's health checks and reconfigure, the operator) every request is an internal
endpoint of :mod:`kubeserve.runtime.wire`. No path spelling can turn one into the other.

The handshake costs one round trip per new connection; connections are pooled and kept alive, so
requests pay nothing for it.

Where the secret comes from: ``KUBESERVE_DATA_PLANE_SECRET`` (a Kubernetes Secret, rendered as an
env var of the pod) or the file named by ``KUBESERVE_DATA_PLANE_SECRET_FILE`` (``kubeserve start``
writes one, mode 0600, into its state directory). :func:`take_secret` removes both variables from
the environment once read, so user code and its subprocesses do not inherit them.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import os
import secrets
import socket
import struct
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TypeVar

from kubeserve.runtime import local_socket
from kubeserve.runtime.http1 import read_response

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "SIGNATURE_HEADER",
    "ChannelError",
    "Role",
    "ServerHandshake",
    "connect",
    "create_secret_file",
    "open_socket",
    "request",
    "sign_request",
    "take_secret",
    "verify_request",
]

SECRET_ENV = "KUBESERVE_DATA_PLANE_SECRET"
SECRET_FILE_ENV = "KUBESERVE_DATA_PLANE_SECRET_FILE"

MAGIC = b"KSC1"
_NONCE = 16
_MAC = 32
HELLO_SIZE = len(MAGIC) + 1 + _NONCE
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


def _proof(secret: bytes, label: bytes, role: bytes, caller: bytes, replica: bytes) -> bytes:
    return hmac.new(secret, label + role + caller + replica, hashlib.sha256).digest()


# -- the secret ----------------------------------------------------------------------------------


def new_secret() -> str:
    return secrets.token_hex(32)


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
            text = Path(path).read_text()
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


async def _handshake(sock: socket.socket, role: Role, secret: bytes) -> None:
    loop = asyncio.get_running_loop()
    caller = os.urandom(_NONCE)
    await loop.sock_sendall(sock, MAGIC + role.value + caller)
    challenge = b""
    while len(challenge) < CHALLENGE_SIZE:
        data = await loop.sock_recv(sock, CHALLENGE_SIZE - len(challenge))
        if not data:
            raise ChannelError("the replica closed the connection during the handshake")
        challenge += data
    replica, proof = challenge[:_NONCE], challenge[_NONCE:]
    if not hmac.compare_digest(proof, _proof(secret, b"server", role.value, caller, replica)):
        raise ChannelError("the peer is not a replica of this instance (wrong handshake proof)")
    await loop.sock_sendall(sock, _proof(secret, b"client", role.value, caller, replica))


async def open_socket(
    host: str, port: int, role: Role, secret: bytes, timeout_s: float | None = None
) -> tuple[socket.socket, bool]:
    """A socket to the replica on ``host:port`` past the handshake, and whether it is a unix
    socket (the replica's same-host socket when it has one, else TCP).

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
            await _handshake(sock, role, secret)
        except BaseException:
            sock.close()
            raise
    return sock, is_unix


P = TypeVar("P", bound=asyncio.BaseProtocol)


async def connect(
    factory: Callable[[], P],
    host: str,
    port: int,
    role: Role,
    secret: bytes,
    timeout_s: float | None = None,
) -> P:
    """A protocol from ``factory`` connected to the replica on ``host:port``, past the
    handshake (see :func:`open_socket`)."""
    sock, is_unix = await open_socket(host, port, role, secret, timeout_s)
    loop = asyncio.get_running_loop()
    if is_unix:
        _, protocol = await loop.create_unix_connection(factory, sock=sock)
    else:
        _, protocol = await loop.create_connection(factory, sock=sock)
    return protocol


async def request(
    host: str,
    port: int,
    method: str,
    path: str,
    secret: bytes,
    body: bytes = b"",
    *,
    timeout_s: float = 30.0,
) -> tuple[int, bytes]:
    """One internal request on a fresh ``CONTROL`` connection: (status, body).

    For the controller's and the operator's occasional calls (readiness, health checks,
    reconfigure); the hot paths keep pooled connections instead.
    """
    async with asyncio.timeout(timeout_s):
        sock, _ = await open_socket(host, port, Role.CONTROL, secret)
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n"
            )
            if body:
                head += "Content-Type: application/json\r\n"
            writer.write(head.encode("latin-1") + b"\r\n" + body)
            return await read_response(reader, "replica")
        finally:
            writer.close()


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
    nonce = secrets.token_hex(8)
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


# -- the replica's side --------------------------------------------------------------------------


class ServerHandshake:
    """The replica's half of the handshake, fed the first bytes of a connection.

    :meth:`feed` returns ``None`` while more bytes are needed, raises :class:`ChannelError` when
    the peer failed, and once the peer proved itself returns the bytes that followed its proof
    (the start of its HTTP stream); :attr:`role` then says what the connection may carry.
    """

    __slots__ = ("_buffer", "_caller", "_replica", "_secret", "_write", "role")

    def __init__(self, secret: bytes, write: Callable[[bytes], object]) -> None:
        self._secret = secret
        self._write = write
        self._buffer = b""
        self._caller = b""
        self._replica = b""
        self.role: Role | None = None

    def feed(self, data: bytes) -> bytes | None:
        buffer = self._buffer + data
        if not self._replica:
            if len(buffer) < HELLO_SIZE:
                if not MAGIC.startswith(buffer[: len(MAGIC)]):
                    raise ChannelError("not a kubeserve channel (bad greeting)")
                self._buffer = buffer
                return None
            hello, buffer = buffer[:HELLO_SIZE], buffer[HELLO_SIZE:]
            if not hello.startswith(MAGIC):
                raise ChannelError("not a kubeserve channel (bad greeting)")
            try:
                self.role = Role(hello[len(MAGIC) : len(MAGIC) + 1])
            except ValueError:
                raise ChannelError("unknown channel role") from None
            self._caller = hello[len(MAGIC) + 1 :]
            self._replica = os.urandom(_NONCE)
            proof = _proof(self._secret, b"server", self.role.value, self._caller, self._replica)
            self._write(self._replica + proof)
        if len(buffer) < PROOF_SIZE:
            self._buffer = buffer
            return None
        assert self.role is not None
        expected = _proof(self._secret, b"client", self.role.value, self._caller, self._replica)
        if not hmac.compare_digest(buffer[:PROOF_SIZE], expected):
            raise ChannelError("the caller failed the handshake (wrong secret)")
        self._buffer = b""
        return buffer[PROOF_SIZE:]


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
