"""HTTP/1.1 byte-level pieces shared inside the data plane (private to runtime).

Everything here works on ``bytes`` already parsed by httptools: classifying header names, framing
body pieces, building the few responses the proxy writes itself, and reading one whole response
for the occasional one-shot requests (discovery polls, internal calls of the controller).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from binascii import hexlify
from typing import Any

import httptools

__all__ = [
    "CHUNKED_END",
    "HOP_OR_CHUNKED_NAME_LENGTHS",
    "REASONS",
    "REQUEST_ID",
    "HeaderKind",
    "chunk_prefix",
    "classify_header",
    "http_date",
    "is_request_id",
    "is_websocket",
    "local_response",
    "new_request_id",
    "read_response",
    "usable_request_id",
]

#: The last chunk of a chunked body (trailers are not forwarded).
CHUNKED_END = b"0\r\n\r\n"


class HeaderKind:
    """What the proxy does with a header: forward it, drop it, or note the body framing."""

    FORWARD = 0
    #: hop-by-hop (RFC 9110 section 7.6.1): describes one connection, never forwarded
    HOP_BY_HOP = 1
    #: ``Transfer-Encoding: ...chunked``; forwarded, and the body is re-chunked piece by piece
    CHUNKED = 2
    #: ``Content-Length``; forwarded, the body passes through as is
    LENGTH = 3
    #: ``X-Request-Id``; forwarded, and echoed on the response
    REQUEST_ID = 4


_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
)
# Lengths of the names that need a closer look: most headers are rejected by one len() and a set
# lookup, without lower-casing the name (which allocates). A name of any other length is FORWARD.
_SPECIAL_NAME_LENGTHS = frozenset({2, 7, 10, 12, 14, 16, 17})
#: Lengths of the HOP_BY_HOP and CHUNKED names: a caller that does not care about Content-Length
#: or X-Request-Id can skip :func:`classify_header` for any other name.
HOP_OR_CHUNKED_NAME_LENGTHS = _SPECIAL_NAME_LENGTHS - {12, 14}
#: The request id header as kubeserve writes it (matched case-insensitively when read).
REQUEST_ID = b"x-request-id"


def classify_header(name: bytes, value: bytes) -> int:
    """The :class:`HeaderKind` of one header."""
    if len(name) not in _SPECIAL_NAME_LENGTHS:
        return HeaderKind.FORWARD
    lname = name.lower()
    if lname in _HOP_BY_HOP:
        return HeaderKind.HOP_BY_HOP
    if lname == b"transfer-encoding":
        return HeaderKind.CHUNKED if b"chunked" in value.lower() else HeaderKind.FORWARD
    if lname == b"content-length":
        return HeaderKind.LENGTH
    if lname == REQUEST_ID:
        return HeaderKind.REQUEST_ID
    return HeaderKind.FORWARD


def is_request_id(name: bytes) -> bool:
    """Whether a header name is ``X-Request-Id``, in any case (one ``len`` for most names)."""
    return len(name) == 12 and (name == REQUEST_ID or name.lower() == REQUEST_ID)


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(seconds: float) -> str:
    """An HTTP ``Date`` value (RFC 9110's IMF-fixdate), as ``email.utils.formatdate(seconds,
    usegmt=True)`` writes it, without loading the ``email`` package into every replica."""
    t = time.gmtime(seconds)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def is_websocket(upgrade: bytes) -> bool:
    """Whether an ``Upgrade`` header's value asks for WebSocket (among the protocols it lists)."""
    return any(token.strip().lower() == b"websocket" for token in upgrade.split(b","))


def new_request_id() -> bytes:
    """A fresh request id: 128 random bits as 32 hex digits (the spelling of a UUID's hex).

    ``random`` (seeded from ``os.urandom`` when the process starts) costs a fraction of ``uuid4``
    (a syscall and an object per id): ids must be unique, not secret."""
    return hexlify(_getrandbits(128).to_bytes(16, "little"))


_getrandbits = random.getrandbits

#: The longest client ``X-Request-Id`` kept; longer ones are replaced.
MAX_REQUEST_ID = 128
#: A client's request id is kept when it is 1 to MAX_REQUEST_ID of these characters (UUIDs, hex
#: ids, Ray's and most tracers' ids): nothing that could forge a log field or a header.
usable_request_id = re.compile(rb"[A-Za-z0-9._:@/+=~-]{1,%d}" % MAX_REQUEST_ID).fullmatch


#: The reason phrase of each status code, as ``http.HTTPStatus`` has them (Python 3.11; a test
#: checks they agree): a dict literal instead of the ``http`` module, whose enum costs a proxy
#: and a replica ~0.3 MB each.
REASONS: dict[int, bytes] = {
    100: b"Continue",
    101: b"Switching Protocols",
    102: b"Processing",
    103: b"Early Hints",
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    203: b"Non-Authoritative Information",
    204: b"No Content",
    205: b"Reset Content",
    206: b"Partial Content",
    207: b"Multi-Status",
    208: b"Already Reported",
    226: b"IM Used",
    300: b"Multiple Choices",
    301: b"Moved Permanently",
    302: b"Found",
    303: b"See Other",
    304: b"Not Modified",
    305: b"Use Proxy",
    307: b"Temporary Redirect",
    308: b"Permanent Redirect",
    400: b"Bad Request",
    401: b"Unauthorized",
    402: b"Payment Required",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    406: b"Not Acceptable",
    407: b"Proxy Authentication Required",
    408: b"Request Timeout",
    409: b"Conflict",
    410: b"Gone",
    411: b"Length Required",
    412: b"Precondition Failed",
    413: b"Request Entity Too Large",
    414: b"Request-URI Too Long",
    415: b"Unsupported Media Type",
    416: b"Requested Range Not Satisfiable",
    417: b"Expectation Failed",
    418: b"I'm a Teapot",
    421: b"Misdirected Request",
    422: b"Unprocessable Entity",
    423: b"Locked",
    424: b"Failed Dependency",
    425: b"Too Early",
    426: b"Upgrade Required",
    428: b"Precondition Required",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    451: b"Unavailable For Legal Reasons",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    505: b"HTTP Version Not Supported",
    506: b"Variant Also Negotiates",
    507: b"Insufficient Storage",
    508: b"Loop Detected",
    510: b"Not Extended",
    511: b"Network Authentication Required",
}


def chunk_prefix(size: int) -> bytes:
    """The size line of one chunk; the chunk is ``prefix + data + b"\\r\\n"``."""
    return b"%x\r\n" % size


def local_response(
    status: int,
    body: bytes,
    *,
    content_type: bytes = b"text/plain; charset=utf-8",
    close: bool = False,
    request_id: bytes | None = None,
    retry_after: bytes = b"",
) -> bytes:
    """A complete response the proxy answers itself (health, routes, errors); ``retry_after``:
    the ``Retry-After`` seconds, when there is one."""
    phrase = REASONS.get(status, b"Unknown")
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s%s\r\n" % (
        status,
        phrase,
        content_type,
        len(body),
        b"x-request-id: %s\r\n" % request_id if request_id else b"",
        b"Retry-After: %s\r\n" % retry_after if retry_after else b"",
        b"Connection: close\r\n" if close else b"",
    )
    return head + body


async def read_response(reader: asyncio.StreamReader, peer: str) -> tuple[int, bytes]:
    """One whole response from ``reader``: (status, body). Raises ``ConnectionError`` naming
    ``peer`` when the answer is cut short or unparsable."""
    collected = _Collected()
    parser = httptools.HttpResponseParser(collected)
    try:
        while not collected.complete:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError(f"the {peer} closed the connection mid-answer")
            parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise ConnectionError(f"unparsable answer from the {peer}: {exc}") from exc
    return parser.get_status_code(), b"".join(collected.body)


class _Collected:
    """httptools callbacks collecting one response body."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self, *_: Any) -> None:
        self.complete = True
