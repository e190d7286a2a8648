"""The request a plain ingress's ``__call__`` receives, made without Starlette until it is read
beyond kubeserve's ``Request`` (``_LightRequest``, built field by field per request): the same
method, path, query, headers and body as the request that came, and it pickles as one."""

from __future__ import annotations

import subprocess
import sys

from support.common import ROOT

_CHECK = r"""
import asyncio, pickle, sys
from kubeserve.runtime.replica.asgi import user_request
from kubeserve.runtime.replica.http import HttpRequest
from kubeserve.sdk.http import Request

headers = [("Host", "example.com"), ("X-Thing", "a"), ("x-thing", "b"),
           ("Content-Type", "application/json")]
raw = HttpRequest("post", "/app/items", "q=1&q=2&empty=", headers, b'{"n": 3}', True, False,
                  "rid-1", "")
light = user_request(raw, "/app", "/mnt")
assert "starlette.requests" not in sys.modules  # nothing read beyond kubeserve's Request yet
assert type(light).__name__ == "_LightRequest" and isinstance(light, Request)
assert light.method == "POST"  # as Request() spells it
assert light.path == "/mnt/app/items" and light.query_string == "q=1&q=2&empty="
assert asyncio.run(light.body()) == b'{"n": 3}'
assert asyncio.run(light.json()) == {"n": 3}


async def chunks(request):
    return [chunk async for chunk in request.stream()]


assert asyncio.run(chunks(light)) == [b'{"n": 3}']
copy = pickle.loads(pickle.dumps(light))
assert type(copy) is Request
assert (copy.method, copy.path, copy.query_string) == ("POST", "/mnt/app/items", "q=1&q=2&empty=")
assert copy.headers.getlist("x-thing") == ["a", "b"]
assert asyncio.run(copy.body()) == b'{"n": 3}'
# read further: the headers, the query, the URL, as the request gave them
assert light.headers["host"] == "example.com"
assert light.headers.getlist("x-thing") == ["a", "b"]
assert light.query_params.getlist("q") == ["1", "2"] and light.query_params["empty"] == ""
assert str(light.url).endswith("/mnt/app/items?q=1&q=2&empty=")
no_mount = user_request(raw, "/app")
assert no_mount.path == "/app/items" and asyncio.run(no_mount.body()) == b'{"n": 3}'
print("ok")
"""


def test_the_light_request_gives_what_the_request_sent_and_pickles_as_one() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], check=True, cwd=ROOT, capture_output=True, text=True
    )
    assert done.stdout.strip() == "ok"
