"""The HTTP request and response types user code sees, with the Starlette-style surface Ray Serve
users write against (``request.method``, ``request.url.path``, ``request.query_params``,
``request.headers``, ``await request.body()``, ``await request.json()``; ``Response``,
``JSONResponse`` ...).

They are plain data, independent of the server that produced them, so they pickle (a request may be
passed through a handle) and can be built in tests. :func:`to_response` states the conversion rules
for whatever an HTTP ingress returns.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from pathlib import PurePath
from typing import Any, NamedTuple, cast
from urllib.parse import parse_qsl

__all__ = [
    "URL",
    "HTMLResponse",
    "Headers",
    "JSONResponse",
    "PlainTextResponse",
    "QueryParams",
    "Request",
    "Response",
    "StreamingResponse",
    "to_response",
]


class _MultiMap(Mapping[str, str]):
    """An immutable multi-valued mapping; ``m[key]`` and ``m.get(key)`` give the first value."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = [(self._key(k), v) for k, v in items]

    @staticmethod
    def _key(key: str) -> str:
        return key

    def __getitem__(self, key: str) -> str:
        key = self._key(key)
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and any(k == self._key(key) for k, _ in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for k, _ in self._items))

    def __len__(self) -> int:
        return len(dict.fromkeys(k for k, _ in self._items))

    def getlist(self, key: str) -> list[str]:
        """Every value of ``key``, in request order (empty when absent)."""
        key = self._key(key)
        return [v for k, v in self._items if k == key]

    def multi_items(self) -> list[tuple[str, str]]:
        """Every (key, value) pair, repeated keys included, in request order."""
        return list(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _MultiMap):
            return type(self) is type(other) and self._items == other._items
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"


class QueryParams(_MultiMap):
    """The query string as a multi-valued mapping: ``?a=1&a=2`` gives ``getlist("a") == ["1", "2"]``
    and ``["a"] == "1"``."""

    __slots__ = ()


class Headers(_MultiMap):
    """Request headers: case-insensitive keys (stored lower-case), repeated headers kept."""

    __slots__ = ()

    @staticmethod
    def _key(key: str) -> str:
        return key.lower()


class URL(NamedTuple):
    """The request URL as the client addressed it."""

    scheme: str
    netloc: str
    path: str
    query: str

    @property
    def hostname(self) -> str:
        return self.netloc.rsplit(":", 1)[0] if ":" in self.netloc else self.netloc

    @property
    def port(self) -> int | None:
        host, _, port = self.netloc.rpartition(":")
        return int(port) if host and port.isdigit() else None

    def __str__(self) -> str:
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{self.netloc}{self.path}{query}"


class Request:
    """One HTTP request to an ingress deployment, its body already read.

    ``path`` is the path the client requested (the route prefix is not stripped), percent-decoded;
    ``query_string`` is the raw text after ``?``.
    """

    __slots__ = ("_body", "_headers", "_query", "_raw_headers", "method", "path", "query_string")

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str = "",
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> None:
        self.method = method.upper()
        self.path = path
        self.query_string = query_string
        self._raw_headers = list(headers)
        self._body = body
        self._headers: Headers | None = None
        self._query: QueryParams | None = None

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self._raw_headers)
        return self._headers

    @property
    def query_params(self) -> QueryParams:
        if self._query is None:
            self._query = QueryParams(parse_qsl(self.query_string, keep_blank_values=True))
        return self._query

    @property
    def url(self) -> URL:
        return URL("http", self.headers.get("host", ""), self.path, self.query_string)

    async def body(self) -> bytes:
        return self._body

    async def json(self) -> Any:
        """The body parsed as JSON; raises :class:`ValueError` when it is not JSON."""
        return json.loads(self._body)

    async def stream(self) -> AsyncIterator[bytes]:
        """The body as an async iterator of chunks (one chunk: the body is read before the call)."""
        if self._body:
            yield self._body

    def __reduce__(
        self,
    ) -> tuple[type[Request], tuple[str, str, str, list[tuple[str, str]], bytes]]:
        return (Request, (self.method, self.path, self.query_string, self._raw_headers, self._body))

    def __repr__(self) -> str:
        query = f"?{self.query_string}" if self.query_string else ""
        return f"Request({self.method} {self.path}{query})"


class Response:
    """A complete HTTP response. ``str`` content is encoded as UTF-8; for ``text/*`` media types a
    ``charset=utf-8`` parameter is added to the ``content-type`` header."""

    media_type: str | None = None
    charset = "utf-8"

    def __init__(
        self,
        content: Any = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.status_code = status_code
        if media_type is not None:
            self.media_type = media_type
        self.body = self.render(content)
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if self.media_type is not None and "content-type" not in self.headers:
            content_type = self.media_type
            if content_type.startswith("text/") and "charset=" not in content_type:
                content_type += f"; charset={self.charset}"
            self.headers["content-type"] = content_type

    def render(self, content: Any) -> bytes:
        if content is None:
            return b""
        if isinstance(content, bytes | bytearray | memoryview):
            return bytes(content)
        if isinstance(content, str):
            return content.encode(self.charset)
        raise TypeError(f"Response content must be str or bytes, got {type(content).__name__}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status_code={self.status_code}, {len(self.body)} bytes)"


class PlainTextResponse(Response):
    media_type = "text/plain"


class HTMLResponse(Response):
    media_type = "text/html"


class JSONResponse(Response):
    """``content`` serialized as compact JSON (UTF-8, non-ASCII kept)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class StreamingResponse:
    """A response sent with chunked transfer encoding while ``content`` (a sync or async iterator of
    ``str``/``bytes``) produces chunks."""

    def __init__(
        self,
        content: Iterable[str | bytes] | AsyncIterator[str | bytes] | Any,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.content = content
        self.status_code = status_code
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if media_type is not None and "content-type" not in self.headers:
            self.headers["content-type"] = media_type

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The content as bytes chunks; raises :class:`TypeError` on a chunk of another type."""
        if hasattr(self.content, "__aiter__"):
            async for chunk in self.content:
                yield _chunk_bytes(chunk)
        else:
            for chunk in self.content:
                yield _chunk_bytes(chunk)


def _chunk_bytes(chunk: Any) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode("utf-8")
    raise TypeError(f"a streamed chunk must be str or bytes, got {type(chunk).__name__}")


_JSON_TYPES = (dict, list, int, float, bool)


def to_response(result: Any) -> Response | StreamingResponse:
    """What the client receives for a value an HTTP ingress returned.

    ``Response``/``StreamingResponse`` as given; ``str`` -> ``text/plain; charset=utf-8``; ``bytes``
    -> ``application/octet-stream``; ``dict``/``list``/numbers/booleans -> ``application/json``;
    ``None`` -> an empty 200; a sync or async generator (or any iterator) -> a chunked stream whose
    content type is ``text/plain; charset=utf-8`` (the stream's chunks may be ``str`` or ``bytes``).
    """
    if isinstance(result, Response | StreamingResponse):
        return result
    if isinstance(result, str):
        return PlainTextResponse(result)
    if isinstance(result, bytes | bytearray | memoryview):
        return Response(result, media_type="application/octet-stream")
    if result is None:
        return Response()
    if isinstance(result, _JSON_TYPES):
        return JSONResponse(result)
    if hasattr(result, "__aiter__") or isinstance(result, Iterator):
        return StreamingResponse(result, media_type="text/plain; charset=utf-8")
    return JSONResponse(jsonable(result))


#: types sent in ISO format, and types sent as strings, by module: a value of one can only exist
#: once its module is loaded, so a replica imports none of them for this
_ISO_TYPES = (("datetime", "date"), ("datetime", "time"))
_STR_TYPES = (("uuid", "UUID"), ("decimal", "Decimal"))


def _loaded(types: tuple[tuple[str, str], ...]) -> tuple[type, ...]:
    """The classes of ``types`` whose module is loaded."""
    return tuple(
        getattr(sys.modules[module], name) for module, name in types if module in sys.modules
    )


def jsonable(value: Any) -> Any:
    """``value`` as JSON-able data, as Ray encodes what an HTTP handler returns (FastAPI's
    ``jsonable_encoder``): mappings (Starlette's ``QueryParams`` too) as objects, tuples and sets
    as arrays, dataclasses and pydantic models by their fields, enums by value, dates in ISO
    format, UUIDs, decimals and paths as strings. Raises :class:`TypeError` for anything else."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, _loaded(_ISO_TYPES)):
        return cast(Any, value).isoformat()
    if isinstance(value, (PurePath, *_loaded(_STR_TYPES))):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if callable(getattr(value, "model_dump", None)):  # a pydantic model
        return value.model_dump(mode="json")
    raise TypeError(
        f"an HTTP ingress returned {type(value).__name__}; return str, bytes, JSON-able data "
        "(dicts, lists, mappings, dataclasses, pydantic models...), a Response, a generator, "
        "or None"
    )
