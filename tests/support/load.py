"""A steady load through the proxy: clients on keep-alive connections, every outcome recorded.

Each client behaves as urllib3's pool does with a kept-alive connection: before it sends a
request on one, it checks that the server has not closed it meanwhile (the socket would read as
ready: end of file), and connects afresh if so (``urllib3.util.connection.is_connection_dropped``).
A request is never sent twice: a connection closed after any byte of a request went out is that
request's failure. A response saying ``Connection: close`` ends the connection.
"""

from __future__ import annotations

import http.client
import itertools
import select
import ssl
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from support.common import wait_for

CLIENTS = 12


@dataclass
class Outcome:
    request_id: str
    started: float
    ended: float
    status: int  # 0: no answer (connection refused, reset, timed out)
    #: why there was no answer: the exception's class name (``ConnectionRefusedError``...); for
    #: an answer other than 200, the start of its body
    error: str = ""


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to ``host`` (an address), verifying the certificate as ``server_hostname``'s: a
    Service's DNS name reached at its ClusterIP from a host that cannot resolve it."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        server_hostname: str,
        timeout: float = 10,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.tls_context, self.server_hostname = context, server_hostname

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self.tls_context.wrap_socket(self.sock, server_hostname=self.server_hostname)


@dataclass(frozen=True)
class TLSClient:
    """How a client speaks HTTPS: the context (its CA, its certificate if any) and the name the
    server's certificate must carry."""

    context: ssl.SSLContext
    server_hostname: str

    def connection(self, host: str, port: int, timeout: float = 10) -> PinnedHTTPSConnection:
        return PinnedHTTPSConnection(host, port, self.context, self.server_hostname, timeout)


class Load:
    """Clients on keep-alive connections, each request with a fresh id; records every outcome."""

    def __init__(
        self,
        port: int,
        clients: int = CLIENTS,
        host: str = "127.0.0.1",
        timeout_s: float = 10,
        tls: TLSClient | None = None,
    ) -> None:
        """Requests ``GET /`` of ``host:port`` with a fresh ``X-Request-Id``; a 200 must answer
        that id; no answer within ``timeout_s`` counts as a failure. ``tls``: over HTTPS."""
        self.host, self.port, self.timeout_s, self.tls = host, port, timeout_s, tls
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _client(self, n: int) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            request_id = f"c{n}-{uuid.uuid4().hex}"
            started = time.monotonic()
            status, error = 0, ""
            try:
                if conn is not None and _dropped(conn):
                    conn.close()  # closed while idle: nothing of this request was sent
                    conn = None
                if conn is None:
                    conn = self._connection()
                conn.request("GET", "/", headers={"X-Request-Id": request_id})
                response = conn.getresponse()
                body = response.read()
                status = response.status
                if status == 200:
                    assert body.decode() == request_id, (body, request_id)
                else:
                    error = body[:80].decode(errors="replace")
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                error = type(exc).__name__
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                self.outcomes.append(Outcome(request_id, started, time.monotonic(), status, error))
            if status != 200:
                self.stop.wait(0.05)  # pacing while nothing answers, not synchronisation

    def _connection(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return self.tls.connection(self.host, self.port, self.timeout_s)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def served_since(self, instant: float) -> float | None:
        """Seconds from ``instant`` to the first 200 of a request sent after it, or None."""
        with self.lock:
            ends = [o.ended for o in self.outcomes if o.started >= instant and o.status == 200]
        return min(ends) - instant if ends else None

    def wait_served(self, instant: float, within_s: float) -> float:
        return wait_for(
            lambda: self.served_since(instant), within_s, what="requests to be served again"
        )

    def answered_since(self, instant: float) -> int:
        """Requests sent at or after ``instant`` and answered 200."""
        with self.lock:
            return sum(1 for o in self.outcomes if o.started >= instant and o.status == 200)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether the server closed the idle keep-alive connection ``conn`` (it reads as ready:
    the end of file, or bytes nobody asked for)."""
    if conn.sock is None:
        return False
    readable, _, _ = select.select([conn.sock], [], [], 0)
    return bool(readable)


def failures(outcomes: list[Outcome]) -> dict[str, int]:
    """The requests not answered 200, counted by status (and error, when there was no answer)."""
    kinds = Counter(f"{o.status}:{o.error}" if o.error else str(o.status) for o in outcomes
                    if o.status != 200)  # fmt: skip
    return dict(kinds)


def longest_gap(outcomes: list[Outcome], start: float, end: float) -> float:
    """The longest time within [start, end] without a request answered 200."""
    ends = sorted(o.ended for o in outcomes if o.status == 200 and start <= o.ended <= end)
    marks = [start, *ends, end]
    return max(b - a for a, b in itertools.pairwise(marks))
