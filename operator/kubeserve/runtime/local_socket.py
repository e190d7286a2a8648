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
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["connect", "connect_socket", "listen", "socket_name"]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

P = TypeVar("P", bound=asyncio.BaseProtocol)


def socket_name(host: str, port: int) -> str | None:
    """The abstract socket of the replica listening on ``host:port``, or None (not loopback or
    not Linux)."""
    if sys.platform != "linux" or host not in _LOOPBACK:
        return None
    return f"\0kubeserve-replica-{port}"


async def listen(
    factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
) -> asyncio.AbstractServer | None:
    """Serve ``factory`` on the socket of ``host:port`` too; None when there is none or when it
    is taken."""
    name = socket_name(host, port)
    if name is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(factory, sock=sock, backlog=1024)


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
