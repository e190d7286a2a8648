"""The request surface user code reads, and how ingress return values become responses."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import pickle
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kubeserve import JSONResponse, PlainTextResponse, Request, Response, StreamingResponse
from kubeserve.sdk.http import to_response


def make_request() -> Request:
    return Request(
        "post",
        "/api/items",
        "tag=a&tag=b&empty=&q=x%20y",
        [("Host", "example.com:8000"), ("X-Multi", "1"), ("x-multi", "2"), ("Accept", "*/*")],
        b'{"k": [1, 2]}',
    )


def test_method_url_and_query_params() -> None:
    request = make_request()
    assert request.method == "POST"
    assert request.url.path == "/api/items"
    assert request.url.query == "tag=a&tag=b&empty=&q=x%20y"
    assert (request.url.hostname, request.url.port) == ("example.com", 8000)
    assert str(request.url) == "http://example.com:8000/api/items?tag=a&tag=b&empty=&q=x%20y"
    params = request.query_params
    assert params["tag"] == "a" and params.get("tag") == "a"
    assert params.getlist("tag") == ["a", "b"]
    assert params["empty"] == "" and params["q"] == "x y"
    assert params.get("missing") is None and params.getlist("missing") == []
    assert list(params) == ["tag", "empty", "q"] and len(params) == 3


def test_headers_are_case_insensitive_and_multi_valued() -> None:
    headers = make_request().headers
    assert headers["x-multi"] == headers["X-MULTI"] == "1"
    assert headers.getlist("X-Multi") == ["1", "2"]
    assert "ACCEPT" in headers and "cookie" not in headers
    assert ("accept", "*/*") in headers.multi_items()
    with pytest.raises(KeyError):
        headers["cookie"]


def test_body_json_and_pickling() -> None:
    request = make_request()
    assert asyncio.run(request.body()) == b'{"k": [1, 2]}'
    assert asyncio.run(request.json()) == {"k": [1, 2]}
    clone = pickle.loads(pickle.dumps(request))
    assert (clone.method, clone.url, clone.headers.getlist("x-multi")) == (
        "POST",
        request.url,
        ["1", "2"],
    )
    assert asyncio.run(clone.body()) == b'{"k": [1, 2]}'


def test_response_types() -> None:
    assert Response("hi", media_type="text/html").headers["content-type"] == (
        "text/html; charset=utf-8"
    )
    response = Response(b"x", status_code=204, headers={"X-A": "1"})
    assert (response.status_code, response.body, response.headers) == (204, b"x", {"x-a": "1"})
    assert JSONResponse({"é": 1}).body == '{"é":1}'.encode()
    assert PlainTextResponse("t").headers["content-type"] == "text/plain; charset=utf-8"
    with pytest.raises(TypeError):
        Response(42)


async def agen() -> AsyncIterator[str]:
    yield "a"
    yield "b"


def gen() -> Iterator[bytes]:
    yield b"c"


@pytest.mark.parametrize(
    ("value", "content_type", "body"),
    [
        ("héllo", "text/plain; charset=utf-8", "héllo".encode()),
        (b"\x00", "application/octet-stream", b"\x00"),
        ({"a": 1}, "application/json", b'{"a":1}'),
        ([1, 2], "application/json", b"[1,2]"),
        (None, None, b""),
    ],
)
def test_to_response_conversions(value: Any, content_type: str | None, body: bytes) -> None:
    response = to_response(value)
    assert isinstance(response, Response)
    assert response.headers.get("content-type") == content_type
    assert (response.status_code, response.body) == (200, body)


def test_generators_become_streams() -> None:
    async def collect(response: Any) -> list[bytes]:
        return [chunk async for chunk in response.chunks()]

    for value, chunks in [(agen(), [b"a", b"b"]), (gen(), [b"c"])]:
        response = to_response(value)
        assert isinstance(response, StreamingResponse)
        assert asyncio.run(collect(response)) == chunks
    explicit = StreamingResponse(gen(), media_type="text/event-stream")
    assert to_response(explicit) is explicit
    with pytest.raises(TypeError, match="an HTTP ingress returned object"):
        to_response(object())


@dataclasses.dataclass
class _Point:
    x: int
    tags: tuple[str, ...]


class _Color(enum.Enum):
    RED = "red"


def test_other_values_are_encoded_as_rays_jsonable_encoder_does() -> None:
    """What Ray sends for a handler's return value that is not a dict or list: Starlette's
    ``request.query_params`` (a mapping) as an object, tuples and sets as arrays, dataclasses by
    their fields, enums by value, dates in ISO format."""
    starlette = pytest.importorskip("starlette.datastructures")
    cases: list[tuple[Any, bytes]] = [
        (starlette.QueryParams("a=b&c=d"), b'{"a":"b","c":"d"}'),
        (Request("GET", "/", "a=b&c=d").query_params, b'{"a":"b","c":"d"}'),
        ((1, 2), b"[1,2]"),
        (frozenset({3}), b"[3]"),
        (_Point(1, ("a",)), b'{"x":1,"tags":["a"]}'),
        (_Color.RED, b'"red"'),
        (datetime.date(2024, 1, 2), b'"2024-01-02"'),
    ]
    for value, body in cases:
        response = to_response(value)
        assert isinstance(response, Response)
        assert response.headers.get("content-type") == "application/json"
        assert response.body == body, value
