"""What every test and benchmark needs: the repository root, free ports, waiting, HTTP, asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from http.client import HTTPConnection
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    what: str = "",
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline.

    ``ignoring``: exceptions that count as "not yet" (a server still starting, say)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what or predicate}: last={last!r}"
    )


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """One HTTP request; returns (status, decoded JSON or text)."""
    data = raw
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload, ctype = (
                response.status,
                response.read(),
                response.headers.get("Content-Type", ""),
            )
    except urllib.error.HTTPError as err:
        status, payload, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(payload)
    return status, payload.decode(errors="replace")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is as good as gone
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        if state == "Z":
            return False
    return True


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 60.0, *, uvloop: bool = False) -> T:
    """Run one coroutine to completion on a fresh event loop, failing after ``timeout_s``.

    ``uvloop``: on uvloop, as the proxy and replicas run in production (its transports differ
    from asyncio's)."""
    bounded = asyncio.wait_for(coro, timeout_s)
    if uvloop:
        import uvloop as uv

        return uv.run(bounded)
    return asyncio.run(bounded)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], within_s: float = 5.0, interval_s: float = 0.01
) -> None:
    """The asyncio twin of :func:`wait_for`: poll ``predicate`` (plain or async) on the loop."""
    deadline = time.monotonic() + within_s
    while True:
        found = predicate()
        if not isinstance(found, bool):
            found = await found
        if found:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {predicate}")
        await asyncio.sleep(interval_s)


def streamed_lines(host: str, port: int, path: str, timeout_s: float = 60) -> Streamed:
    """GET ``path`` and read the answer's first line, then the rest, timing both: whether a
    streamed answer arrives piece by piece (the first line well before the end)."""
    conn = HTTPConnection(host, port, timeout=timeout_s)
    try:
        started = time.monotonic()
        conn.request("GET", path)
        resp = conn.getresponse()
        first = resp.readline()
        first_at = time.monotonic() - started
        rest = resp.read()
        return Streamed(resp.status, first, first_at, rest, time.monotonic() - started)
    finally:
        conn.close()


@dataclasses.dataclass(frozen=True)
class Streamed:
    """What :func:`streamed_lines` read: the status, the first line and when it came (seconds
    after the request), the rest and when the answer ended."""

    status: int
    first: bytes
    first_at: float
    rest: bytes
    total: float
