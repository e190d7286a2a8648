"""Every way Ray's replica calls an HTTP handler, one deployment each: handlers that take no
request, function deployments with and without one, and handlers that are generators."""

import asyncio
import threading
import time

from ray import serve
from starlette.requests import Request


@serve.deployment
class NoRequest:
    def __call__(self):
        return "hi"


@serve.deployment
class AsyncNoRequest:
    async def __call__(self):
        return {"async": True}


@serve.deployment
def no_request_function():
    return "hi from a function"


@serve.deployment
async def async_function(request: Request):
    return f"async function at {request.url.path}"


@serve.deployment
class VarArgs:
    def __call__(self, *args):
        return f"{len(args)} {isinstance(args[0], Request)}"


@serve.deployment
class AsyncGenerator:
    async def __call__(self, request: Request):
        for i in range(int(request.query_params.get("n", "3"))):
            yield f"{i}\n"


#: set by a request to ``/release``; the blocking generator waits for it between its chunks
RELEASED = threading.Event()


@serve.deployment
class BlockingGenerator:
    """A sync generator that blocks between chunks: its steps must run off the event loop, or
    the ``/release`` request it waits for could never be served."""

    def __call__(self, request: Request):
        if request.url.path.endswith("/release"):
            RELEASED.set()
            yield "released"
            return
        RELEASED.clear()
        yield "waiting\n"
        yield "released\n" if RELEASED.wait(10) else "never released\n"


#: set by a request to ``/release``; the blocking handler waits for it in its worker thread
HANDLER_RELEASED = threading.Event()


@serve.deployment(max_ongoing_requests=4)
class BlockingHandler:
    """A plain method that blocks its worker thread until ``/release`` is served: the replica's
    other requests (here ``/release`` itself, which arrives while this call blocks its thread)
    must run meanwhile. It answers what it saw in its thread: whether an event loop runs there,
    the request's multiplexed model id (a context variable) and the replica's context."""

    def __call__(self, request: Request):
        if request.url.path.endswith("/release"):
            HANDLER_RELEASED.set()
            return "released"
        HANDLER_RELEASED.clear()
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        return {
            "released": HANDLER_RELEASED.wait(10),
            "on_loop": on_loop,
            "model": serve.get_multiplexed_model_id(),
            "deployment": serve.get_replica_context().deployment,
        }


no_request = NoRequest.bind()
async_no_request = AsyncNoRequest.bind()
no_request_function_app = no_request_function.bind()
async_function_app = async_function.bind()
var_args = VarArgs.bind()
async_generator = AsyncGenerator.bind()
blocking_generator = BlockingGenerator.bind()
blocking_handler = BlockingHandler.bind()


@serve.deployment
class SyncAnswers:
    """A plain ``__call__`` whose answers take every way back from its worker thread: a ``str``
    (written by the worker itself), one larger than a socket takes at once (the rest written by
    the event loop), a dict (answered on the loop), an exception (a 500); ``kind=sleep`` first
    sleeps ``n`` seconds."""

    def __call__(self, request: Request):
        kind = request.query_params.get("kind", "text")
        n = request.query_params.get("n", "")
        if kind == "big":
            return "x" * int(n)
        if kind == "dict":
            return {"n": n}
        if kind == "raise":
            raise ValueError("asked to fail")
        if kind == "sleep":
            time.sleep(float(n))
        return f"text {n}"


sync_answers = SyncAnswers.bind()
