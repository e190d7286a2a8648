"""Same-host shortcut: a replica on a loopback address also listens on an abstract unix socket.

On one machine (the local backend) every proxy hop and handle call crosses the loopback TCP stack
twice per request; a unix socket carries the same bytes with much less kernel work (no TCP state
machine, no checksums, no ACKs). The replica binds the abstract name derived from its TCP port
right after binding the port itself, so the name belongs to the process that owns the port; a
client whose target host is a loopback address tries that name first and falls back to TCP when
nothing listens there (another network namespace, such as a Kubernetes pod, or a replica from
before this shortcut existed). The protocol on the socket is the replica protocol of
:mod:`kubeserve.runtime.wire`, behind the handshake of :mod:`kubeserve.runtime.channel`.

Abstract names have no permissions: any local user can bind one first. So a client only uses the
socket when the listener runs under its own uid (``SO_PEERCRED``), and falls back to TCP otherwise;
and the channel handshake then proves the listener holds the instance's secret before a request
byte is sent.

Abstract names (Linux) live in the network namespace, like the TCP port they mirror, and vanish
when the socket closes: nothing to clean up after a crash. Elsewhere this module does nothing.

Pods on one node (``ServeInstance.spec.proxy.nodeLocalSockets``): each pod has its own network
namespace, so no abstract name is shared; the operator mounts one directory of the node (a
``hostPath``, :data:`~kubeserve.runtime.kubernetes.contract.NODE_SOCKETS_DIR` in the pods) into
the instance's proxy and replica pods and names it in ``KUBESERVE_NODE_SOCKETS``
(:data:`NODE_SOCKETS_ENV`), and a replica's pod IP in :data:`NODE_ADDRESS_ENV`. A replica
then also listens on ``<dir>/<pod IP>-<port>.sock``, and a caller whose target is not loopback
tries ``<dir>/<host>-<port>.sock`` first: the file exists only for a replica on the caller's
node (pod IPs are the node's own), and a stale one (a replica killed before it could remove it)
refuses the connection, so the caller goes on with TCP. A replica removes a stale file of its
own address before binding. The same-uid check and the handshake hold as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "NODE_ADDRESS_ENV",
    "NODE_SOCKETS_ENV",
    "LocalListener",
    "connect",
    "connect_socket",
    "listen",
    "socket_name",
]

#: The node's directory of replica sockets, in a pod that has it (read by kubeserve-fastpath
#: too, under the same name).
NODE_SOCKETS_ENV = "KUBESERVE_NODE_SOCKETS"
#: The address callers know a replica pod by (its pod IP), which names its socket there.
NODE_ADDRESS_ENV = "KUBESERVE_NODE_SOCKET_ADDRESS"

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

log = logging.getLogger(__name__)

P = TypeVar("P", bound=asyncio.BaseProtocol)


def socket_name(host: str, port: int) -> str | None:
    """The socket of the replica listening on ``host:port``, or None (not Linux, or neither
    loopback nor a pod with the node's socket directory): an abstract name for a loopback host,
    a path in the node's directory for another."""
    if sys.platform != "linux":
        return None
    if host in _LOOPBACK:
        return f"\0kubeserve-replica-{port}"
    directory = os.environ.get(NODE_SOCKETS_ENV)
    if not directory:
        return None
    return f"{directory}/{host}-{port}.sock"


class LocalListener:
    """The replica's server on its socket; :meth:`close` also removes a socket file."""

    def __init__(self, server: asyncio.AbstractServer, path: str | None) -> None:
        self.server = server
        self.path = path  # a file in the node's directory, None for an abstract name

    def close(self) -> None:
        self.server.close()
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


async def listen(
    factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
) -> LocalListener | None:
    """Serve ``factory`` on the socket of ``host:port`` too (in a pod, of the pod's IP and
    ``port``); None when there is none or when it is taken."""
    if host not in _LOOPBACK and os.environ.get(NODE_SOCKETS_ENV):
        host = os.environ.get(NODE_ADDRESS_ENV) or host
    name = socket_name(host, port)
    if name is None:
        return None
    path = None if name.startswith("\0") else name
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if path is not None:
            _remove_stale(path)
        sock.bind(name)
        if path is not None:
            os.chmod(path, 0o600)  # the directory is the pods' user's alone; the file too
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if path is not None:
            log.warning("replica socket %s not available (%s): callers use TCP", path, exc)
        return None
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(factory, sock=sock, backlog=1024)
    return LocalListener(server, path)


def _remove_stale(path: str) -> None:
    """Remove the socket file a replica of the same address left (killed before it removed it):
    addresses are unique among a node's running pods, so nobody serves on it any more."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def connect_socket(host: str, port: int) -> socket.socket | None:
    """A non-blocking socket connected to the replica socket of ``host:port``, or None when the
    caller should use TCP (no socket here, nobody listening, its backlog is full, or the listener
    is another user's process)."""
    name = socket_name(host, port)
    if name is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(name)  # a unix connect completes at once or fails at once
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        sock.close()
        return None
    _, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid():
        sock.close()
        return None
    return sock


async def connect(factory: Callable[[], P], host: str, port: int) -> P | None:
    """A protocol connected over the socket of ``host:port``, or None when the caller should use
    TCP (see :func:`connect_socket`)."""
    sock = connect_socket(host, port)
    if sock is None:
        return None
    _, protocol = await asyncio.get_running_loop().create_unix_connection(factory, sock=sock)
    return protocol
