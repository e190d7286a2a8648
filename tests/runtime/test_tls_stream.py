"""The proxy's own TLS over a plain transport (:mod:`kubeserve.runtime.tls_stream`): a response
written in pieces leaves as one TLS record, a client's close_notify ends the stream, a client that
never finishes its handshake is cut at the timeout, plain HTTP on the TLS port is closed, and the
protocol above can be swapped (a WebSocket's tunnel).

Real TLS: a uvloop server in a thread, clients on real sockets that see the records on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from kubeserve.runtime.tls_stream import TLSServerProtocol
from support.tls_certs import Authority, Pair

_APPLICATION_DATA = 23


class Answering(asyncio.Protocol):
    """Answers each read with ``b"got "`` and the read, in two pieces (one ``writelines``);
    ``b"swap"`` hands the connection to :class:`Shouting` (and says so); notes an end of stream."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if data == b"swap":
            self.transport.set_protocol(Shouting(self.transport))
            self.transport.write(b"swapped")
            return
        self.transport.writelines([b"got ", data])

    def eof_received(self) -> bool | None:
        self.events.append("eof")
        return None


class Counting(asyncio.Protocol):
    """Answers with the number of bytes received once a line ends."""

    def __init__(self, events: list[str]) -> None:
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.received.endswith(b"\n"):
            self.transport.write(b"%d" % len(self.received))


class Shouting(asyncio.Protocol):
    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data.upper())


class Server:
    """A TLS server on 127.0.0.1 in a thread of its own, with a short handshake timeout."""

    def __init__(
        self, pair: Pair, app: Callable[[list[str]], asyncio.Protocol] = Answering
    ) -> None:
        self.app = app
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(pair.cert, pair.key)
        self.events: list[str] = []
        self.loop = uvloop.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        def protocol() -> asyncio.Protocol:
            return TLSServerProtocol(self.context, self.app(self.events), handshake_timeout_s=0.5)

        server = self.loop.run_until_complete(self.loop.create_server(protocol, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Client:
    """A TLS client that reads the server's records one at a time."""

    def __init__(self, port: int, ca: Authority) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        context = ssl.create_default_context(cafile=str(ca.path))
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send()
                self.incoming.write(self.record()[1])
        self._send()

    def _send(self) -> None:
        self.sock.sendall(self.outgoing.read())

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def record(self) -> tuple[int, bytes]:
        """The next TLS record on the wire: its type and its bytes, header included."""
        head = self._exactly(5)
        kind, _version, length = struct.unpack("!BHH", head)
        return kind, head + self._exactly(length)

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self._send()

    def answer(self) -> tuple[bytes, int]:
        """The next plaintext the server sends, and how many records it came in (session
        tickets, which decrypt to nothing, are not counted)."""
        records = 0
        while True:
            kind, record = self.record()
            self.incoming.write(record)
            try:
                plain = self.tls.read(65536)
            except ssl.SSLWantReadError:
                continue
            records += kind == _APPLICATION_DATA
            return plain, records

    def close_notify(self) -> None:
        """Send our close_notify (without waiting for the server's)."""
        with contextlib.suppress(ssl.SSLWantReadError):
            self.tls.unwrap()
        self._send()

    def close(self) -> None:
        self.sock.close()


def until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes (the socket's timeout fails the test)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


@pytest.fixture
def server(ca: Authority) -> Iterator[Server]:
    served = Server(ca.issue("localhost"))
    yield served
    served.close()


def test_an_answer_written_in_pieces_is_one_record(server: Server, ca: Authority) -> None:
    client = Client(server.port, ca)
    for request in (b"first", b"second"):
        client.send(request)
        assert client.answer() == (b"got " + request, 1)
    client.close()


def test_many_records_at_once_arrive_whole(ca: Authority) -> None:
    server = Server(ca.issue("localhost"), Counting)
    try:
        client = Client(server.port, ca)
        client.send(b"x" * 100_000 + b"\n")  # 7 records, most of them in one read
        assert client.answer()[0] == b"100001"
        client.close()
    finally:
        server.close()


def test_close_notify_ends_the_stream(server: Server, ca: Authority) -> None:
    client = Client(server.port, ca)
    client.send(b"hello")
    assert client.answer()[0] == b"got hello"
    client.close_notify()
    deadline = time.monotonic() + 5
    while "eof" not in server.events:
        assert time.monotonic() < deadline, "the server never saw the end of the stream"
        time.sleep(0.01)
    client.close()


def test_a_stalled_handshake_is_cut(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never finished
    started = time.monotonic()
    assert until_closed(sock) == b""
    assert time.monotonic() - started < 3  # the handshake timeout is 0.5 s
    sock.close()


def test_plain_http_on_the_tls_port_is_closed(server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not until_closed(sock).startswith(b"HTTP")  # at most a TLS alert, then closed
    sock.close()


def test_the_protocol_above_can_be_swapped(server: Server, ca: Authority) -> None:
    client = Client(server.port, ca)
    client.send(b"swap")
    assert client.answer()[0] == b"swapped"
    client.send(b"louder")
    assert client.answer()[0] == b"LOUDER"
    client.close()
