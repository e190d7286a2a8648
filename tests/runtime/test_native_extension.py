"""``kubeserve._native`` (native/pyext) against the Python code it replaces, in both directions.

The extension is optional (``kubeserve.runtime.native_module``): these tests compare it with the
pure Python path where it is built, and are skipped where it is not. The rest of the runtime's
tests run on whichever path is active; ``KUBESERVE_PURE_PYTHON=1`` runs them on the Python one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus

import pytest

from kubeserve.runtime import sealing
from kubeserve.runtime.channel import Role
from kubeserve.runtime.native_module import NATIVE
from kubeserve.runtime.replica import http as replica_http
from kubeserve.runtime.replica.http import HttpRequest, HttpResponse, ReplicaHttpServer
from support.channel_front import SECRET
from support.common import run

pytestmark = pytest.mark.skipif(NATIVE is None, reason="kubeserve._native is not built")

KEY = b"k" * 32
PAYLOADS = [b"GET / HTTP/1.1\r\n\r\n", b"x" * 1024, b"y" * 1025, os.urandom(70_000), b"end"]


def test_frames_sealed_by_either_side_open_in_the_other_across_any_split() -> None:
    assert NATIVE is not None
    for seal_with, open_with in (
        (NATIVE.Sealer, sealing.PyOpener),
        (sealing.PySealer, NATIVE.Opener),
    ):
        sealer = seal_with(KEY)
        stream = b"".join(sealer.seal(p) for p in PAYLOADS)
        for step in (1, 5, 4096, len(stream)):
            opener = open_with(KEY)
            got = b"".join(opener.feed(stream[i : i + step]) for i in range(0, len(stream), step))
            assert got == b"".join(PAYLOADS)


def test_both_sealers_write_the_same_frames_whole_in_parts_and_past_the_frame_limit() -> None:
    assert NATIVE is not None
    ours, theirs = NATIVE.Sealer(KEY), sealing.PySealer(KEY)
    big = os.urandom(sealing.MAX_FRAME * 2 + 10)
    for payload in (*PAYLOADS, big, bytearray(b"ba"), memoryview(b"mv")):
        assert ours.seal(payload) == theirs.seal(payload)
    parts = [b"HTTP/1.1 200 OK\r\n", bytearray(b"a: b\r\n"), b"\r\n", memoryview(b"body")]
    assert ours.seal_parts(parts) == theirs.seal_parts(parts)
    assert ours.seal_parts(iter(parts)) == theirs.seal_parts(parts)
    assert ours.seal(b"") == theirs.seal(b"") == b""


@pytest.mark.parametrize("attack", ["flipped tag", "flipped payload", "reordered", "replayed"])
def test_the_extension_refuses_a_tampered_or_reordered_frame_sealed_by_python(attack: str) -> None:
    assert NATIVE is not None
    sealer = sealing.PySealer(KEY)
    one, two, three = (sealer.seal(p) for p in (b"first", b"second", b"third"))
    opener = NATIVE.Opener(KEY)
    assert opener.feed(one) == b"first"
    bad = {
        "flipped tag": two[:-1] + bytes([two[-1] ^ 1]),
        "flipped payload": two[:5] + bytes([two[5] ^ 1]) + two[6:],
        "reordered": three + two,
        "replayed": one,
    }[attack]
    with pytest.raises(sealing.FrameError, match="MAC"):
        opener.feed(bad)
    assert sealing.FrameError is NATIVE.FrameError
    assert issubclass(NATIVE.FrameError, ConnectionError)


def test_the_extension_refuses_an_oversized_frame_before_buffering_it() -> None:
    assert NATIVE is not None
    with pytest.raises(NATIVE.FrameError, match="limit"):
        NATIVE.Opener(KEY).feed((sealing.MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 100)


# -- the request parse ---------------------------------------------------------------------------

REQUESTS = [
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc\r\nX-Request-Id: def\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Type: text/x\r\n\r\nhello",
    b"GET /v HTTP/1.1\r\nHost: a\r\nX-Thing:  padded \t\r\nx-request-id: \r\n\r\n",
    b"GET /u HTTP/1.1\r\nHost: a\r\nX-Name: caf\xc3\xa9\r\n\r\n",
    b"GET /u HTTP/1.1\r\nHost: a\r\nX-Bad: caf\xe9\r\n\r\n",
    b"GET /a%2Fb/../c HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET //x/./y HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
    b"GET /close HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    b"GET /old HTTP/1.0\r\nHost: a\r\n\r\n",
    b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET /m HTTP/1.1\r\nServe_Multiplexed_Model_Id: m1\r\nserve_multiplexed_model_id: m2\r\n\r\n",
    b"GET /m2 HTTP/1.1\r\nserve_multiplexed_model_id: \r\nserve_multiplexed_model_id: m3\r\n\r\n",
    b"POST /m3 HTTP/1.1\r\nserve_multiplexed_model_id: m4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]


@contextlib.asynccontextmanager
async def _replica_port(
    handler: Callable[[HttpRequest], Awaitable[HttpResponse]], piece: str, *, compiled: bool
) -> AsyncIterator[int]:
    """A replica HTTP server of ``handler`` on a free port, with the compiled ``piece`` of
    ``kubeserve.runtime.replica.http`` (``_parse_request``, ``_answer``) in use or left out."""
    saved = getattr(replica_http, piece)
    setattr(replica_http, piece, saved if compiled else None)
    server = await asyncio.get_running_loop().create_server(
        ReplicaHttpServer(handler), "127.0.0.1", 0
    )
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        setattr(replica_http, piece, saved)
        server.close()


async def _served(raw: bytes, *, compiled: bool, expected: int) -> list[HttpRequest]:
    """The requests a replica server's handler saw for ``raw`` (sent in one write)."""
    seen: list[HttpRequest] = []

    async def handler(request: HttpRequest) -> HttpResponse:
        seen.append(request)
        return HttpResponse(200, b"ok")

    async with _replica_port(handler, "_parse_request", compiled=compiled) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        while len(seen) < expected and await reader.read(65536):
            pass
        writer.close()
    return seen


def _fields(request: HttpRequest) -> tuple[object, ...]:
    return (
        request.method,
        request.path,
        request.query_string,
        request.headers,
        request.body,
        request.keep_alive,
        request.http10,
        request.request_id if request.request_id in ("abc", "def") else bool(request.request_id),
        request.model_id,
    )


def test_the_compiled_parse_gives_user_code_what_httptools_gives() -> None:
    """Pipelined in one read and each alone, the requests it covers and those it leaves to
    httptools (chunked, HTTP/1.0, paths to normalise, bytes that are not UTF-8, trailing blanks,
    Connection headers) alike."""
    kept = [r for r in REQUESTS if b"close" not in r and b"HTTP/1.0" not in r]
    pipelined = b"".join(kept)

    async def go() -> None:
        compiled = await _served(pipelined, compiled=True, expected=len(kept))
        plain = await _served(pipelined, compiled=False, expected=len(kept))
        assert len(compiled) == len(kept)
        assert [_fields(r) for r in compiled] == [_fields(r) for r in plain]
        for raw in REQUESTS:  # each alone, in its own read
            alone = await _served(raw, compiled=True, expected=1)
            assert len(alone) == 1
            assert [_fields(r) for r in alone] == [
                _fields(r) for r in await _served(raw, compiled=False, expected=1)
            ]

    run(go(), uvloop=True)


def test_the_compiled_parse_leaves_limits_errors_and_partial_requests_to_httptools() -> None:
    """It never refuses anything itself: a request over a limit, malformed or partial is
    httptools' to answer (414, 431, 413, 400) or to wait for."""
    assert NATIVE is not None and replica_http._parse_request is NATIVE.parse_request
    parse = NATIVE.parse_request
    post = b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
    method, path, query, headers, body, rid, keep_alive, end, model = parse(post, 0, 100, 1000, 10)
    assert (method, path, query, body, rid, keep_alive, end, model) == (
        "POST",
        "/p",
        "",
        b"hello",
        "",
        True,
        len(post),
        "",
    )
    assert headers == [("Host", "a"), ("Content-Length", "5")]
    assert parse(b"xx" + post, 2, 100, 1000, 10)[7] == len(post) + 2  # from an offset
    assert parse(post, 0, 100, 1000, -1) is not None  # no body limit
    assert parse(post, 0, 1, 1000, 10) is None  # target over max_url_bytes: 414 by httptools
    assert parse(post, 0, 100, 20, 10) is None  # head over max_header_bytes: 431
    assert parse(post, 0, 100, 1000, 4) is None  # body over max_body_bytes: 413
    assert parse(post[:-1], 0, 100, 1000, 10) is None  # body still arriving
    assert parse(post[:20], 0, 100, 1000, 10) is None  # head still arriving
    assert parse(b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 0, 100, 1000, 10) is None
    assert parse(b"GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 0, 100, 1000, 10) is None
    two = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab"
    assert parse(two, 0, 100, 1000, 10) is None  # ambiguous framing


# -- the answer ----------------------------------------------------------------------------------

ANSWERS = {
    "/plain": HttpResponse(200, b"ok"),
    "/headers": HttpResponse(201, b"", {"X-A": "1", "x-b": "caf\xe9"}, content_type="a/b"),
    "/own-id": HttpResponse(404, b"no", {"x-request-id": "mine"}),
    "/odd-status": HttpResponse(599, b"?"),
    "/bytearray": HttpResponse(200, bytearray(b"ba")),  # type: ignore[arg-type]
    "/close": HttpResponse(503, b"busy", close=True),  # the last: the connection ends with it
}


async def _answers(*, compiled: bool) -> bytes:
    """What a client reads for ``ANSWERS`` requested in turn, without the Date lines."""

    async def handler(request: HttpRequest) -> HttpResponse:
        return ANSWERS[request.path]

    async with _replica_port(handler, "_answer", compiled=compiled) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"".join(
                b"GET %s HTTP/1.1\r\nX-Request-Id: r%d\r\n\r\n" % (path.encode(), i)
                for i, path in enumerate(ANSWERS)
            )
        )
        data = await reader.read()  # "/close" closes after its answer
        writer.close()
    return b"".join(line for line in data.splitlines(True) if not line.startswith(b"Date: "))


def test_the_compiled_answer_is_the_python_one_byte_for_byte() -> None:
    async def go() -> None:
        compiled, plain = await _answers(compiled=True), await _answers(compiled=False)
        assert compiled == plain
        assert compiled.count(b"HTTP/1.1 ") == len(ANSWERS)
        assert b"x-b: caf\xe9\r\n" in compiled and b"x-request-id: mine\r\n" in compiled

    run(go(), uvloop=True)


# -- the tally -----------------------------------------------------------------------------------


def test_the_compiled_tally_counts_and_writes_what_the_python_one_does() -> None:
    """Same per-route counts, sums and buckets; the same access lines byte for byte (TEXT and
    JSON, latencies rounded alike, half-way cases included, odd statuses, characters JSON
    escapes), formatted in the format given when each was done."""
    assert NATIVE is not None
    from kubeserve.runtime.logs import MAX_ACCESS_LINES, AccessLog, ComponentLog
    from kubeserve.runtime.metrics import LATENCY_BUCKETS_MS
    from kubeserve.runtime.replica.tally import PyTally, new_tally

    assert NATIVE.MAX_ACCESS_LINES == MAX_ACCESS_LINES
    compiled, python = new_tally(LATENCY_BUCKETS_MS), PyTally(LATENCY_BUCKETS_MS)
    assert type(compiled) is NATIVE.Tally
    component = ComponentLog("replica", "Echo%d", 'Echo-1-"x"', "app", "Echo%d")
    text, as_json = (AccessLog(component, e).native_format() for e in ("TEXT", "JSON"))
    latencies = [0.05, 0.15, 0.25, 0.35, 1.0, 1.25, 2.5, 12.55, 999.95, 1234.5, 700_000.0]
    statuses: list[object] = [200, "CANCELLED", HTTPStatus.OK, True, None, "caf\u00e9\u2028"]
    at = 1_795_000_000.0015
    for tally in (compiled, python):
        assert tally.done(0.0, 0.001, "/a", "GET", "/a", 200, "", "/a")  # no format: no line
        tally.access_format(text["json"], text["component"])
        for i, ms in enumerate(latencies):
            route = "/a" if i % 3 else "/b"
            status = statuses[i % len(statuses)]
            rid = f"r{i}"
            assert not tally.done(0.0, ms / 1e3, route, "GET", route, status, rid, route, at + i)
        tally.access_format(as_json["json"], as_json["component"])
        tally.done(1.0, 1.0 + 0.001, "", "CALL", "greet", "OK", "", "/b", at)
        tally.done(1.0, 1.0 + 0.002, "")  # counted, no access line
        odd = '/\u00e9"\\\U0001f600'
        tally.done(1.0, 1.5, "/\u00e9", "POST", odd, 503, "id\t", "", at + 0.999)
    assert compiled.take_metrics() == python.take_metrics()
    assert compiled.take_metrics() == python.take_metrics() == []
    assert compiled.lines() == python.lines() == len(latencies) + 2
    (block, dropped), (text_block, py_dropped) = compiled.take_lines(), python.take_lines()
    assert isinstance(block, bytes) and isinstance(text_block, str)
    assert block == text_block.encode() and dropped == py_dropped == 0
    lines = [line + "\n" for line in block.decode().split("\n")[:-1]]  # (a U+2028 in one)
    assert len(lines) == len(latencies) + 2 and lines[0].startswith("INFO 2026-11-18 ")
    # exactly half-way latencies (0.25 ms, 1.25 ms) round to even, as Python's %.1f does
    assert ' Echo%d Echo-1-"x" r2 -- GET /a 200 0.2ms\n' in lines[2]
    assert ' Echo%d Echo-1-"x" r5 -- GET /a caf\u00e9\u2028 1.2ms\n' in lines[5]
    assert lines[3].endswith(" -- GET /b True 0.3ms\n") and " None " in lines[4]
    assert '"message": "CALL greet OK 1.0ms"' in lines[-2] and '"route": "/b"}' in lines[-2]
    assert lines[-1].endswith('"request_id": "id\\t"}\n') and "\\ud83d\\ude00" in lines[-1]
    assert compiled.lines() == python.lines() == 0
    assert compiled.take_lines() == (b"", 0) and python.take_lines() == ("", 0)


# -- frames opened and parsed in one call ------------------------------------------------------

_LIMITS = (8192, 65536, 1 << 20)  # max_url, max_head, max_body


def _opened_and_parsed(stream: bytes, step: int, *, ingress: bool) -> tuple[list[tuple], bytes]:
    """``stream`` (sealed frames) fed ``step`` bytes at a time to ``Opener.feed_requests``: the
    requests' fields and what it left for httptools, joined."""
    assert NATIVE is not None
    opener = NATIVE.Opener(KEY)
    opener.serve_requests(HttpRequest, *_LIMITS, b"" if ingress else b"/-/duplex/", ingress)
    requests: list[HttpRequest] = []
    rest = b""
    for i in range(0, len(stream), step):
        made, left = opener.feed_requests(stream[i : i + step])
        requests.extend(made)
        rest += left
    return [_fields(r) for r in requests], rest


def _parsed_in_python(plain: bytes, *, ingress: bool) -> tuple[list[tuple], bytes]:
    """What ``PyOpener.feed`` + ``parse_request`` give, as ``_Connection`` used them."""
    assert NATIVE is not None
    out, start = [], 0
    while (parsed := NATIVE.parse_request(plain, start, *_LIMITS)) is not None:
        method, path, query, headers, body, request_id, keep_alive, end, model_id = parsed
        if not ingress and path.startswith("/-/duplex/"):
            break
        if not request_id and ingress:
            request_id = "made"
        out.append(
            _fields(
                HttpRequest(
                    method, path, query, headers, body, keep_alive, False, request_id, model_id
                )
            )
        )
        start = end
    return out, plain[start:]


def test_feed_requests_is_feed_then_the_compiled_parse_across_any_split() -> None:
    """Frames opened and their whole requests made in one call: the same requests, and the
    same bytes left for httptools, as opening then parsing; a request id made up for user
    traffic only (32 hex digits, a new one each time); a duplex call left to httptools."""
    plain = b"".join(REQUESTS[:3]) + b"POST /-/duplex/m HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    sealer = sealing.PySealer(KEY)
    stream = b"".join(sealer.seal(plain[i : i + 50]) for i in range(0, len(plain), 50))
    for ingress in (True, False):
        want = _parsed_in_python(plain, ingress=ingress)
        for step in (1, 7, 64, len(stream)):
            got = _opened_and_parsed(stream, step, ingress=ingress)
            if step == len(stream):
                assert got == want, ingress
            else:  # split reads: fewer whole requests at once, the same bytes in all
                assert got[0] == want[0][: len(got[0])]
    assert NATIVE is not None
    opener = NATIVE.Opener(KEY)
    opener.serve_requests(HttpRequest, *_LIMITS, b"", True)
    made, rest = opener.feed_requests(NATIVE.Sealer(KEY).seal(REQUESTS[0] * 3))
    ids = [r.request_id for r in made]
    assert rest == b"" and len(set(ids)) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    with pytest.raises(NATIVE.FrameError):
        opener.feed_requests(NATIVE.Sealer(KEY).seal(b"GET / HTTP/1.1\r\n\r\n"))  # replayed


def test_seal_answer_is_answer_then_seal() -> None:
    assert NATIVE is not None
    ours, theirs = NATIVE.Sealer(KEY), sealing.PySealer(KEY)
    for status, headers, body, keep_alive in (
        (200, {"content-type": "text/plain"}, b"ok", True),
        (404, {"x-request-id": "mine"}, b"", False),
        (200, {"transfer-encoding": "chunked"}, None, True),
    ):
        args = (status, b"Reason", b"Date: x\r\n", "rid", headers, body, keep_alive)
        assert ours.seal_answer(*args) == theirs.seal(NATIVE.answer(*args))
    assert ours.seal_answer(200, b"OK", b"", "", {"x": "\u20ac"}, b"", True) is None
    assert ours.seal(b"next") == theirs.seal(b"next")  # a refused answer took no number


# -- a handle call's answer opened and parsed in one call ----------------------------------------

CALL_ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x\r\nContent-Length: 3\r\n\r\nabc",
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nx-kubeserve-unserved: capacity\r\n"
    b"X-Kubeserve-Models: a,b\r\nContent-Length: 1\r\n\r\nx",
    b"HTTP/1.1 503 Service Unavailable\r\nX-Kubeserve-Unserved: \r\nContent-Length: 0\r\n\r\n",
]
#: answers left to httptools: chunked, no length, partial, two in one read, HTTP/1.0
LEFT = [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\nabc",
    CALL_ANSWERS[0][:-1],
    CALL_ANSWERS[0] * 2,
    b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
]


def _httptools_answer(raw: bytes) -> tuple[object, ...]:
    import httptools

    seen: dict[str, object] = {"unserved": "", "models": None, "body": b""}

    class Callbacks:
        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"x-kubeserve-unserved":
                seen["unserved"] = value.decode("latin-1") or "unserved"
            elif name.lower() == b"x-kubeserve-models":
                seen["models"] = value

        def on_body(self, body: bytes) -> None:
            seen["body"] = seen["body"] + body  # type: ignore[operator]

        def on_message_complete(self) -> None:  # as _CallConnection reads it
            seen["keep_alive"] = parser.should_keep_alive()

    parser = httptools.HttpResponseParser(Callbacks())
    parser.feed_data(raw)
    return (
        parser.get_status_code(),
        seen["body"],
        seen["keep_alive"],
        seen["unserved"],
        seen["models"],
    )


def test_feed_answer_gives_what_httptools_gives_and_leaves_it_the_rest() -> None:
    assert NATIVE is not None
    for raw in CALL_ANSWERS + LEFT:
        opener = NATIVE.Opener(KEY)
        opener.serve_answers(b"x-kubeserve-unserved", b"x-kubeserve-models")
        answer, rest = opener.feed_answer(NATIVE.Sealer(KEY).seal(raw))
        if raw in CALL_ANSWERS:
            assert answer == _httptools_answer(raw) and rest == b"", raw
        else:
            assert answer is None and rest == raw, raw


class _Collect(asyncio.Protocol):
    """What a sealed client connection receives (opened), and when it closed."""

    def __init__(self) -> None:
        self.data = b""
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _sealed_exchange(raw: bytes, *, fused: bool, role: Role) -> tuple[list[tuple], bytes]:
    """``raw`` sent in one sealed write to a replica server behind the handshake, with the
    fused open-and-parse (and answer-and-seal) in use or not: the requests its handler saw, and
    the answers the client opened (Date lines and request ids made up left out)."""
    from kubeserve.runtime.channel import connect

    seen: list[HttpRequest] = []

    async def handler(request: HttpRequest) -> HttpResponse:
        seen.append(request)
        return HttpResponse(200, request.body or b"ok", close=request.path == "/close")

    saved = sealing.OPENS_REQUESTS
    sealing.OPENS_REQUESTS = fused
    server = await asyncio.get_running_loop().create_server(
        ReplicaHttpServer(handler, control=handler, secret=SECRET, identity="r"), "127.0.0.1", 0
    )
    try:
        port = server.sockets[0].getsockname()[1]
        client = await connect(_Collect, "127.0.0.1", port, role, SECRET, "r")
        client.transport.write(raw)  # type: ignore[attr-defined]
        await asyncio.wait_for(client.done, 5)
    finally:
        sealing.OPENS_REQUESTS = saved
        server.close()
    answers = b"".join(
        line
        for line in client.data.splitlines(True)
        if not line.startswith((b"Date: ", b"x-request-id: "))
    )
    return [_fields(r) for r in seen], answers


def test_a_sealed_connection_serves_alike_with_and_without_the_fused_calls() -> None:
    """Pipelined requests in one sealed write (the compiled parse's and httptools' alike, a
    duplex call on a control connection): the same requests reach the handler, in order, and the
    same answers come back."""
    kept = [r for r in REQUESTS if b"close" not in r and b"HTTP/1.0" not in r]
    raw = b"".join(kept) + b"GET /close HTTP/1.1\r\nHost: a\r\n\r\n"

    async def go() -> None:
        for role in (Role.INGRESS, Role.CONTROL):
            fused = await _sealed_exchange(raw, fused=True, role=role)
            plain = await _sealed_exchange(raw, fused=False, role=role)
            assert fused == plain
            assert len(fused[0]) == len(kept) + 1
            assert fused[1].count(b"HTTP/1.1 200 OK") == len(kept) + 1

    run(go(), uvloop=True)
