"""The replica process: start-up, serving and graceful shutdown (see the package)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvloop

from kubeserve.runtime import channel, local_socket, logs, wire
from kubeserve.runtime.build import format_user_error, load_application
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.logs import ACCESS_LOGGER, access_message
from kubeserve.runtime.metrics import ReplicaMetrics
from kubeserve.runtime.metrics_listener import start_metrics_listener
from kubeserve.runtime.replica.asgi import (
    Lifespan,
    http_scope,
    is_asgi_response,
    root_path_of,
    run_asgi,
    run_websocket,
    user_request,
    websocket_scope,
)
from kubeserve.runtime.replica.asgi import prepare as prepare_asgi
from kubeserve.runtime.replica.http import (
    HttpRequest,
    HttpResponse,
    ReplicaHttpServer,
    StreamedResponse,
    internal_error,
)
from kubeserve.runtime.replica.probe import ProbeListener
from kubeserve.runtime.websocket import WebSocketSession
from kubeserve.sdk import context, multiplex, transport
from kubeserve.sdk.application import GraphNode, map_nodes
from kubeserve.sdk.handle import DeploymentHandle
from kubeserve.sdk.http import StreamingResponse, to_response
from kubeserve.sdk.ingress import asgi_app_of
from kubeserve.sdk.multiplex import MODEL_ID_HEADER

if TYPE_CHECKING:
    from kubeserve.runtime.handle_client import HandleClient

log = logging.getLogger("kubeserve.replica")
_access_log = logging.getLogger(ACCESS_LOGGER)

_PICKLE = "application/octet-stream"
#: Ray Serve's switch for running sync deployment methods on worker threads: on by default, as in
#: Ray; "0" runs them on the event loop (no thread hop per request, but nothing may block).
SYNC_IN_THREADPOOL_ENV = "RAY_SERVE_RUN_SYNC_IN_THREADPOOL"


@dataclass(frozen=True)
class ReplicaCluster:
    """What a replica in a cluster learns from it, given by the command's composition root
    (:mod:`kubeserve.runtime.kubernetes.pod`); a replica on one machine has none."""

    #: the handle client fed by the cluster's routes and replicas (not started), for this
    #: data-plane secret
    handle_client: Callable[[bytes], HandleClient]
    #: ``(True, value)`` when the application's spec overrides this deployment's user_config
    #: (a pod template never carries it), else ``(False, None)``
    user_config_override: Callable[[str], Awaitable[tuple[bool, Any]]]


class ReplicaStartupError(Exception):
    """The replica could not start: bad config, import error, or the user's constructor raised."""


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: ``async def`` functions and methods, and objects
    whose ``__call__`` is one (a functools.partial of either too)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    return (
        not inspect.isroutine(fn)
        and callable(fn)
        and inspect.iscoroutinefunction(type(fn).__call__)
    )


async def _invoke(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code: coroutines on the event loop, plain functions in a worker thread (as Ray
    does), so a blocking method (``time.sleep``, a model's forward pass) never stalls the
    replica's other requests or its health checks. Context variables (the request's id, the
    multiplexed model id) are copied into the thread."""
    if is_async_callable(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _invoke_on_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`_invoke` with sync callables run on the event loop itself (no thread hop), for
    deployments that set ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``: a blocking method then stalls
    the replica, and ``.result()`` on a handle is refused there."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class UserCode:
    """The user's deployment object (or function) and the hooks kubeserve calls on it."""

    def __init__(self, name: str, target: Any, is_function: bool) -> None:
        self.name = name
        self.target = target
        self.is_function = is_function

    @classmethod
    async def construct(cls, node: GraphNode, app_name: str, replica_id: str = "") -> UserCode:
        """Build the user object with handles in place of bound nodes; user exceptions propagate.

        The replica context (``serve.get_replica_context()``) is set before the constructor runs;
        its ``servable_object`` once the object exists.
        """
        replica_context = context.ReplicaContext(
            context.ReplicaID(replica_id, context.DeploymentID(node.name, app_name))
        )
        context.set_replica_context(replica_context)

        def to_handle(child: Any) -> DeploymentHandle:
            return DeploymentHandle(app_name, child.name)

        args = map_nodes(node.args, to_handle)
        kwargs = map_nodes(node.kwargs, to_handle)
        target: Any = node.deployment.func_or_class
        if node.deployment.is_function:
            if args or kwargs:
                raise ReplicaStartupError(
                    f"function deployment {node.name!r} was bound with arguments; "
                    "only class deployments take constructor arguments"
                )
            replica_context.servable_object = target
            return cls(node.name, target, is_function=True)
        init = getattr(target, "__init__", None)
        if inspect.iscoroutinefunction(init):
            instance = target.__new__(target)
            await init(instance, *args, **kwargs)
        else:
            instance = target(*args, **kwargs)
        replica_context.servable_object = instance
        return cls(node.name, instance, is_function=False)

    def method(self, name: str) -> Callable[..., Any] | None:
        """The callable a handle call or HTTP request named ``name`` runs, or None when there is
        none (private dunder methods other than ``__call__`` are never exposed)."""
        if self.is_function:
            return self.target if name == "__call__" else None
        if name.startswith("__") and name != "__call__":
            return None
        found = getattr(self.target, name, None)
        return found if callable(found) else None

    async def reconfigure(self, user_config: Any) -> None:
        """Apply ``user_config``; a no-op for ``None``. Raises what the user's hook raised."""
        if user_config is None:
            return
        hook = None if self.is_function else getattr(self.target, "reconfigure", None)
        if hook is None:
            raise ValueError(
                f"user_config is set but deployment {self.name!r} has no reconfigure method"
            )
        await _invoke(hook, user_config)

    async def check_health(self) -> None:
        hook = None if self.is_function else getattr(self.target, "check_health", None)
        if hook is not None:
            await _invoke(hook)


class Replica:
    """The HTTP side of a replica: dispatch, request accounting, graceful drain.

    Owns ``ongoing``/``processed`` (only touched on the event loop) and ``draining``.
    """

    def __init__(
        self, config: wire.ReplicaConfig, user: UserCode, *, sync_in_threadpool: bool = True
    ) -> None:
        self.config = config
        # Sync user methods run on worker threads unless RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0
        self._run = _invoke if sync_in_threadpool else _invoke_on_loop
        self.user = user
        self.user_config = config["user_config"]
        self._ongoing = 0
        #: the integral of ``ongoing`` over time up to ``_changed_at`` (request-seconds): the
        #: autoscaler reads its growth to get the mean load between two of its reads
        self._ongoing_area = 0.0
        self._changed_at = self._started_at = time.monotonic()
        self.processed = 0
        #: enforced here, for every caller together (each caller's router caps only its own)
        self._max_ongoing = int(config["max_ongoing_requests"])
        self.draining = False
        self._http_target = user.method("__call__")
        self._asgi = None if user.is_function else asgi_app_of(user.target)
        self.lifespan = Lifespan(self._asgi) if self._asgi is not None else None
        self._root_path = root_path_of(config.get("route_prefix"))
        prepare_asgi()  # the first request must not pay for importing Starlette
        self._reconfigure_lock = asyncio.Lock()
        labels = {
            "app": config["app"],
            "deployment": config["deployment"],
            "replica": config["replica_id"],
        }
        self._labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        #: Ray's ``logging_config.enable_access_log``: an access line per request and call
        self.access_log = True
        #: Ray Serve's replica metrics (requests, errors, latency, queries in flight, starts)
        self.metrics_recorder = ReplicaMetrics(
            config["app"], config["deployment"], config["replica_id"], lambda: self._ongoing
        )
        #: the ``route`` label of HTTP requests (Ray's: the application's route prefix); handle
        #: calls have none
        self._route = config.get("route_prefix") or ""
        #: the :data:`~kubeserve.runtime.wire.MODELS_HEADER` value, and the
        #: :func:`~kubeserve.sdk.multiplex.models_version` it was formatted at
        self._models_value = ""
        self._models_version = -1

    @property
    def ongoing(self) -> int:
        return self._ongoing

    @ongoing.setter
    def ongoing(self, value: int) -> None:
        now = time.monotonic()
        self._ongoing_area += self._ongoing * (now - self._changed_at)
        self._changed_at, self._ongoing = now, value
        self.metrics_recorder.changed()

    def _finish(
        self, started: float, route: str, access: tuple[str, str, int | str] | None = None
    ) -> None:
        """A request or handle call that began at ``started`` (``perf_counter``) is done;
        ``access``: its method, route and status for the access line (Ray's ``GET /route 200
        1.2ms``, or ``CALL method OK``), unless ``logging_config.enable_access_log`` is off."""
        self.ongoing -= 1
        self.processed += 1
        latency_ms = (time.perf_counter() - started) * 1000.0
        self.metrics_recorder.done(route, latency_ms)
        if access is not None and self.access_log:
            batched = logs.batched_access()
            if batched is None:
                _access_log.info(access_message(*access, latency_ms))
            else:
                current = context.request_context.get()
                if current is None:
                    batched.add(*access, latency_ms, None, route)
                else:
                    batched.add(*access, latency_ms, current.request_id, current.route or route)

    def ongoing_area(self) -> float:
        """Request-seconds served so far (the integral of ``ongoing``), up to now."""
        return self._ongoing_area + self._ongoing * (time.monotonic() - self._changed_at)

    async def handle_ingress(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        """User traffic (a proxy's ``INGRESS`` connection): every path goes to the user's code."""
        if self.draining:
            return _shutting_down()
        if self._ongoing >= self._max_ongoing:
            return _at_capacity()
        self.ongoing += 1
        started = time.perf_counter()
        status = 500
        streaming = False
        try:
            model_id = _enter_request(request, self._route)
            response = await self._user_http(request, started)
            streaming = isinstance(response, StreamedResponse)
            status = response.status
            if model_id:
                self._tell_models(response)
            return response
        finally:
            if not streaming:  # a stream is counted until its last chunk (see _stream)
                self._finish(started, self._route, (request.method, self._route, status))

    async def handle_websocket(
        self, request: HttpRequest, session: WebSocketSession
    ) -> HttpResponse | None:
        """A WebSocket handshake on user traffic: the ingress's ASGI app serves it, counted as
        one ongoing request for as long as the socket is open. Refused (an HTTP answer) while
        draining or at ``max_ongoing_requests`` (both "unserved": the proxy tries elsewhere), and
        when the deployment is no ASGI ingress."""
        if self.draining:
            return _shutting_down()
        if self._ongoing >= self._max_ongoing:
            return _at_capacity()
        app = self._asgi
        if app is None:
            return HttpResponse(
                501,
                f"deployment {self.user.name!r} takes no WebSocket: only an ASGI ingress "
                "(@serve.ingress(app) with a websocket route) does".encode(),
                close=True,
            )
        self.ongoing += 1
        started = time.perf_counter()
        status = 500
        try:
            _enter_request(request, self._route)
            state = self.lifespan.state if self.lifespan is not None else None
            refusal = await run_websocket(
                app,
                websocket_scope(request, self._root_path, state),
                session,
                request.request_id,
                functools.partial(self.metrics_recorder.error, self._route),
            )
            status = 101 if refusal is None else refusal.status
            return refusal
        finally:
            self._finish(started, self._route, ("WEBSOCKET", self._route, status))

    async def _user_http(
        self, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        if self._asgi is not None:
            return await self._asgi_http(self._asgi, request, started)
        if self._http_target is None:
            return HttpResponse(
                404, f"deployment {self.user.name!r} has no __call__ method".encode()
            )
        try:
            result = await self._run(self._http_target, user_request(request, self._root_path))
            if type(result) is str:  # the common case, without building a Response first
                return HttpResponse(200, result.encode())
            if is_asgi_response(result):  # a Starlette/FastAPI response: sent as it is
                return await self._asgi_http(result, request, started)
            response = to_response(result)
        except Exception as exc:
            self.metrics_recorder.error(self._route, exc)
            # The client gets the request id only: an exception's text may hold secrets. The id
            # finds the traceback in this replica's log.
            log.exception(
                "request %s %s failed (request id %s)",
                request.method,
                request.path,
                request.request_id,
            )
            return internal_error(request.request_id)
        if isinstance(response, StreamingResponse):
            return await self._stream(request, response, started)
        return HttpResponse(
            response.status_code, response.body, response.headers, content_type=None
        )

    async def _asgi_http(
        self, app: Any, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        """``app`` (the ingress's ASGI app, or a Starlette response) answers ``request``."""
        state = self.lifespan.state if self.lifespan is not None else None
        scope = http_scope(request, self._root_path, state)
        try:
            response = await run_asgi(app, scope, request.body, request.request_id)
        except Exception as exc:
            self.metrics_recorder.error(self._route, exc)
            log.exception("request %s failed (request id %s)", request.path, request.request_id)
            return internal_error(request.request_id)
        if isinstance(response, StreamingResponse):
            return await self._stream(request, response, started)
        return response

    async def _stream(
        self, request: HttpRequest, response: StreamingResponse, started: float
    ) -> HttpResponse | StreamedResponse:
        """A chunked response. The first chunk is produced before the status line is sent, so
        a generator that fails at once still gives a 500; a later failure cuts the connection (the
        client sees an incomplete chunked body, never a clean end)."""
        chunks = response.chunks()
        try:
            first: bytes | None = await anext(chunks)
        except StopAsyncIteration:
            first = None
        except Exception as exc:
            self.metrics_recorder.error(self._route, exc)
            log.exception(
                "streamed response to %s %s failed (request id %s)",
                request.method,
                request.path,
                request.request_id,
            )
            return internal_error(request.request_id)

        async def body() -> AsyncIterator[bytes]:
            try:
                if first:
                    yield first
                async for chunk in chunks:
                    yield chunk
            except Exception as exc:
                self.metrics_recorder.error(self._route, exc)
                log.exception(
                    "streamed response to %s %s failed mid-body (request id %s)",
                    request.method,
                    request.path,
                    request.request_id,
                )
                raise
            finally:
                await chunks.aclose()
                self._finish(
                    started, self._route, (request.method, self._route, response.status_code)
                )

        return StreamedResponse(response.status_code, response.headers, body())

    def _tell_models(self, response: HttpResponse | StreamedResponse) -> None:
        """Name the models this replica holds in the answer to a multiplexed request, so that its
        caller routes the next requests for them here (:data:`~kubeserve.runtime.wire.
        MODELS_HEADER`; formatted again only when the loaded models changed)."""
        version = multiplex.models_version()
        if version != self._models_version:
            self._models_version = version
            self._models_value = wire.encode_models(multiplex.loaded_model_ids())
        if self._models_value:
            # a new dict: a streamed response's headers may be the user's own object
            response.headers = {**response.headers, wire.MODELS_HEADER: self._models_value}

    async def handle_control(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        """Internal endpoints (a ``CONTROL`` connection): handle calls, health, reconfigure."""
        path = request.path
        if path.startswith(wire.CALL_PREFIX):
            if request.method != "POST":
                return HttpResponse(405, b"handle calls use POST")
            if self.draining:
                return _shutting_down()
            if self._ongoing >= self._max_ongoing:
                return _at_capacity()
            self.ongoing += 1
            started = time.perf_counter()
            method_name = path[len(wire.CALL_PREFIX) :]
            outcome = "ERROR"
            try:
                answer = await self._call(request, method_name)
                outcome = "OK" if answer.status == 200 else "ERROR"
                return answer
            finally:
                self._finish(started, "", ("CALL", method_name, outcome))
        if path.startswith(wire.STREAM_PREFIX):
            if request.method != "POST":
                return HttpResponse(405, b"handle calls use POST")
            if self.draining:
                return _shutting_down()
            return await self._stream_call(request, path[len(wire.STREAM_PREFIX) :])
        if path == wire.HEALTHZ_PATH:
            return await self._healthz()
        if path == wire.METRICS_PATH:
            return HttpResponse(200, self.metrics().encode())
        if path == wire.RECONFIGURE_PATH:
            if request.method != "POST":
                return HttpResponse(405, b"reconfigure uses POST")
            return await self._reconfigure(request)
        return HttpResponse(404, f"no internal endpoint {path}".encode())

    def _handle_call(
        self, request: HttpRequest, method_name: str
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str] | HttpResponse:
        """The method, arguments and multiplexed model id of a handle call (its options entered
        into the request context), or the answer refusing it."""
        method = self.user.method(method_name)
        if method is None:
            return HttpResponse(
                404, f"deployment {self.user.name!r} has no method {method_name!r}".encode()
            )
        try:
            args, kwargs, options = wire.decode_call_with_options(request.body)
        except Exception as exc:
            return HttpResponse(400, f"undecodable handle call: {_error_text(exc)}".encode())
        return method, args, kwargs, _enter_call(options)

    async def _call(self, request: HttpRequest, method_name: str) -> HttpResponse:
        call = self._handle_call(request, method_name)
        if isinstance(call, HttpResponse):
            return call
        method, args, kwargs, model_id = call
        try:
            result = await self._run(method, *args, **kwargs)
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                result.close() if inspect.isgenerator(result) else await result.aclose()
                raise TypeError(
                    f"Method '{method_name}' returned a generator. You must use "
                    "`handle.options(stream=True)` to call generators on a deployment."
                )
            body = wire.encode_result(result)
        except Exception as exc:
            self.metrics_recorder.error("", exc)
            log.info("handle call %s raised %s", method_name, _error_text(exc))
            answer = HttpResponse(500, wire.encode_error(exc), content_type=_PICKLE)
        else:
            answer = HttpResponse(200, body, content_type=_PICKLE)
        if model_id:
            self._tell_models(answer)
        return answer

    async def _stream_call(
        self, request: HttpRequest, method_name: str
    ) -> HttpResponse | StreamedResponse:
        """A streamed handle call: the generator's items go out as frames as it yields them."""
        call = self._handle_call(request, method_name)
        if isinstance(call, HttpResponse):
            return call
        method, args, kwargs, model_id = call
        self.ongoing += 1
        started = time.perf_counter()
        try:
            items = method(*args, **kwargs)
            if inspect.isawaitable(items):
                items = await items
            if not (inspect.isgenerator(items) or inspect.isasyncgen(items)):
                raise TypeError(
                    f"Method '{method_name}' returned a non-generator ({type(items).__name__}); "
                    "call it without `handle.options(stream=True)`."
                )
        except Exception as exc:
            self.metrics_recorder.error("", exc)
            self._finish(started, "")
            log.info("streamed handle call %s raised %s", method_name, _error_text(exc))
            return HttpResponse(500, wire.encode_error(exc), content_type=_PICKLE)
        frames = self._frames(items, started)
        if not model_id:
            return StreamedResponse(200, {"content-type": _PICKLE}, frames)
        # The first frame before the head, so that the head names the models once the generator
        # began (it loads its model before its first item): _frames turns errors into frames.
        first = await anext(frames)
        streamed = StreamedResponse(200, {"content-type": _PICKLE}, _after(first, frames))
        self._tell_models(streamed)
        return streamed

    async def _frames(self, items: Any, started: float) -> AsyncGenerator[bytes, None]:
        try:
            if inspect.isasyncgen(items):
                async for item in items:
                    yield wire.encode_frame(wire.FRAME_ITEM, wire.encode_result(item))
            else:
                for item in items:
                    yield wire.encode_frame(wire.FRAME_ITEM, wire.encode_result(item))
            yield wire.encode_frame(wire.FRAME_END)
        except Exception as exc:
            self.metrics_recorder.error("", exc)
            yield wire.encode_frame(wire.FRAME_ERROR, wire.encode_error(exc))
        finally:
            self._finish(started, "")

    async def _healthz(self) -> HttpResponse:
        if self.draining:
            return HttpResponse(503, b"replica is shutting down")
        try:
            await self.user.check_health()
        except Exception as exc:
            return HttpResponse(503, _error_text(exc).encode())
        return HttpResponse(200, b"ok")

    async def _reconfigure(self, request: HttpRequest) -> HttpResponse:
        try:
            payload = json.loads(request.body)
            user_config = payload["user_config"]
        except Exception as exc:
            return HttpResponse(
                400, f'body must be JSON {{"user_config": ...}}: {_error_text(exc)}'.encode()
            )
        async with self._reconfigure_lock:
            try:
                await self.user.reconfigure(user_config)
            except Exception as exc:
                log.exception("reconfigure failed")
                return HttpResponse(500, _error_text(exc).encode())
            self.user_config = user_config
        return HttpResponse(200, b"ok")

    def metrics(self) -> str:
        """The Prometheus exposition the autoscaler and ``kubeserve status`` read."""
        labels = self._labels
        return (
            "# HELP kubeserve_replica_ongoing_requests Requests and handle calls in flight.\n"
            "# TYPE kubeserve_replica_ongoing_requests gauge\n"
            f"kubeserve_replica_ongoing_requests{{{labels}}} {self.ongoing}\n"
            "# HELP kubeserve_replica_ongoing_request_seconds_total Integral of the ongoing "
            "requests over time.\n"
            "# TYPE kubeserve_replica_ongoing_request_seconds_total counter\n"
            f"kubeserve_replica_ongoing_request_seconds_total{{{labels}}} {self.ongoing_area()}\n"
            "# HELP kubeserve_replica_uptime_seconds Time since the replica started serving.\n"
            "# TYPE kubeserve_replica_uptime_seconds counter\n"
            f"kubeserve_replica_uptime_seconds{{{labels}}} {time.monotonic() - self._started_at}\n"
            "# HELP kubeserve_replica_processed_requests_total Requests and handle calls done.\n"
            "# TYPE kubeserve_replica_processed_requests_total counter\n"
            f"kubeserve_replica_processed_requests_total{{{labels}}} {self.processed}\n"
            "# HELP kubeserve_replica_max_ongoing_requests Configured cap on requests in flight.\n"
            "# TYPE kubeserve_replica_max_ongoing_requests gauge\n"
            f"kubeserve_replica_max_ongoing_requests{{{labels}}} "
            f"{self.config['max_ongoing_requests']}\n"
        )

    async def drain(self) -> None:
        """Wait for requests in flight, polling every ``graceful_shutdown_wait_loop_s``, at most
        ``graceful_shutdown_timeout_s``; ``draining`` must already be set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config["graceful_shutdown_timeout_s"]
        period = max(self.config["graceful_shutdown_wait_loop_s"], 0.01)
        while self.ongoing and loop.time() < deadline:  # noqa: ASYNC110 - the period is the contract
            await asyncio.sleep(min(period, max(deadline - loop.time(), 0.0)))
        if self.ongoing:
            log.warning("graceful shutdown timed out with %d requests in flight", self.ongoing)


#: After draining, how long a replica waits for its callers to drop their keep-alive connections
#: (they do once discovery tells them the replica left) before it closes them itself.
_CLOSE_GRACE_S = 1.0


async def _let_callers_leave(server: ReplicaHttpServer) -> None:
    """Wait (at most :data:`_CLOSE_GRACE_S`) until no connection is open. A caller that writes a
    request as the replica closes its connection cannot know whether it ran; while the replica
    still reads, such a request is answered "unserved" (503) and safely sent elsewhere."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CLOSE_GRACE_S
    while server.connections and loop.time() < deadline:  # noqa: ASYNC110 - a bounded poll
        await asyncio.sleep(0.02)


def _enter_request(request: HttpRequest, route: str) -> str:
    """Make the request's id, route and multiplexed model id visible to the user's code, its log
    records and the handle calls it makes (each request runs in its own context copy, so this
    never leaks into another request); returns the model id ("" for none)."""
    model_id = ""
    for name, value in request.headers:
        if len(name) == len(MODEL_ID_HEADER) and name.lower() == MODEL_ID_HEADER:
            model_id = value
            break
    context.request_context.set(
        context.RequestContext(request.request_id, multiplexed_model_id=model_id, route=route)
    )
    return model_id


def _enter_call(options: dict[str, Any]) -> str:
    """The same for a handle call: the caller's request id and multiplexed model id (returned,
    "" for none)."""
    request_id, model_id = options.get("request_id"), options.get("model_id")
    if request_id or model_id:
        model_id = str(model_id or "")
        context.request_context.set(
            context.RequestContext(str(request_id or ""), multiplexed_model_id=model_id)
        )
        return model_id
    return ""


async def _after(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """``first``, then what ``rest`` yields; closing this closes ``rest``."""
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


def _shutting_down() -> HttpResponse:
    """The answer to a request that arrives while draining: not started, so callers may retry it
    elsewhere (:data:`~kubeserve.runtime.wire.UNSERVED_HEADER`)."""
    headers = {wire.UNSERVED_HEADER: "shutting-down"}
    return HttpResponse(503, b"replica is shutting down", headers, close=True)


def _at_capacity() -> HttpResponse:
    """The answer to a request over ``max_ongoing_requests``: not started, the caller tries
    again (:data:`~kubeserve.runtime.wire.UNSERVED_AT_CAPACITY`)."""
    headers = {wire.UNSERVED_HEADER: wire.UNSERVED_AT_CAPACITY}
    return HttpResponse(503, b"replica is at max_ongoing_requests", headers)


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _find_node(config: wire.ReplicaConfig) -> GraphNode:
    nodes = load_application(config["import_path"], config.get("app_args")).deployments()
    for node in nodes:
        if node.name == config["deployment"]:
            return node
    names = ", ".join(node.name for node in nodes)
    raise ReplicaStartupError(
        f"deployment {config['deployment']!r} is not in the application at "
        f"{config['import_path']!r} (deployments: {names})"
    )


async def _start_handle_transport(
    controller_url: str | None, secret: bytes, cluster: ReplicaCluster | None
) -> Any:
    """Install the process's handle transport; None (and no transport) without a controller.

    Imported lazily: the handle client is only needed when other deployments are reachable.
    """
    if cluster is not None:
        client = cluster.handle_client(secret)
    elif controller_url:
        module = importlib.import_module("kubeserve.runtime.handle_client")
        client = module.HandleClient(controller_url, secret=secret)
    else:
        return None
    await client.start()
    transport.set_transport(client)
    return client


def configure_logging(
    config: wire.ReplicaConfig,
    logging_config: dict[str, Any] | None,
    output: logging.Handler | None = None,
) -> None:
    """Ray's ``logging_config`` on this replica's records: Ray's line format (or JSON), the
    level, the access lines; the replica's and the current request's fields on every record."""
    component = logs.ComponentLog(
        "replica", config["deployment"], config["replica_id"], config["app"], config["deployment"]
    )
    logs.configure(logs.LogSettings(logging_config), component, output)


async def _start_user_code(config: wire.ReplicaConfig, cluster: ReplicaCluster | None) -> UserCode:
    try:
        node = _find_node(config)
        user_config = config["user_config"]
        if cluster is not None:  # the pod template never carries user_config
            overridden, value = await cluster.user_config_override(config["deployment"])
            user_config = value if overridden else node.deployment.code_options.get("user_config")
        if "logging_config" not in config and node.deployment.code_options.get("logging_config"):
            # the decorator's, when the config gives none
            configure_logging(config, node.deployment.code_options["logging_config"])
        user = await UserCode.construct(node, config["app"], config["replica_id"])
        await user.reconfigure(user_config)
    except ReplicaStartupError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
            raise
        raise ReplicaStartupError(
            f"replica of {config['app']}#{config['deployment']} failed to start: "
            f"{format_user_error(exc)}"
        ) from exc
    return user


async def serve_replica(
    config: wire.ReplicaConfig,
    host: str,
    port: int,
    controller_url: str | None,
    secret: bytes,
    *,
    sync_in_threadpool: bool = True,
    cluster: ReplicaCluster | None = None,
    metrics_port: int | None = None,
) -> None:
    """Run the replica until SIGTERM (or SIGINT), then drain and return.

    Without ``sync_in_threadpool`` the user's sync methods run on the event loop instead of
    worker threads (Ray Serve's ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``). ``cluster``: what the
    cluster the replica runs in tells it; ``metrics_port``: where to serve ``GET /metrics``
    (:mod:`~kubeserve.runtime.metrics_listener`), if anywhere.

    Raises :class:`ReplicaStartupError` when the user code cannot be loaded or constructed.
    """
    loop = asyncio.get_running_loop()
    probe = await _start_probe_listener(config, host)
    metrics_listener = await start_metrics_listener(host, metrics_port, secret)
    client = await _start_handle_transport(controller_url, secret, cluster)
    try:
        replica = Replica(
            config, await _start_user_code(config, cluster), sync_in_threadpool=sync_in_threadpool
        )
        replica.access_log = logs.active().access_log
        if replica.lifespan is not None:
            try:
                await replica.lifespan.startup()
            except Exception as exc:
                raise ReplicaStartupError(
                    f"replica of {config['app']}#{config['deployment']} failed to start: {exc}"
                ) from exc
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        server = ReplicaHttpServer(
            replica.handle_ingress,
            control=replica.handle_control,
            secret=secret,
            limits=RequestLimits.from_mapping(config.get("request_limits")),
            websocket=replica.handle_websocket,
        )
        listener = await loop.create_server(server, host, port, reuse_address=True, backlog=1024)
        # Bound after the TCP port, so the name derived from the port is this process's.
        local = await local_socket.listen(server, host, port)
        log.info("replica %s listening on %s:%d", config["replica_id"], host, port)
        _watch_health(probe, config, replica)
        await stop.wait()
        log.info("replica %s shutting down", config["replica_id"])
        replica.draining = True
        if probe is not None:
            probe.drain()
        listener.close()
        if local is not None:
            local.close()
        await replica.drain()
        await _let_callers_leave(server)
        server.close_all()
        if replica.lifespan is not None:
            await replica.lifespan.shutdown()
    finally:
        if client is not None:
            transport.set_transport(None)
            await client.close()
        if probe is not None:
            await probe.close()
        if metrics_listener is not None:
            await metrics_listener.close()
        batched = logs.batched_access()
        if batched is not None:
            batched.flush()


async def _start_probe_listener(config: wire.ReplicaConfig, host: str) -> ProbeListener | None:
    """The unauthenticated health listener for the kubelet, when the config asks for one."""
    port = config.get("probe_port")
    if port is None:
        return None
    probe = ProbeListener()
    await probe.start(host, port)
    return probe


def _watch_health(
    probe: ProbeListener | None, config: wire.ReplicaConfig, replica: Replica
) -> None:
    """Run the user's ``check_health`` every ``health_check_period_s`` (Ray's defaults: 10 s,
    timeout 30 s) and let the probe listener report the last result."""
    if probe is not None:
        period = float(config.get("health_check_period_s", 10.0))
        timeout = float(config.get("health_check_timeout_s", 30.0))
        probe.watch(replica.user.check_health, period, timeout)


def main(
    argv: list[str] | None = None,
    *,
    cluster: ReplicaCluster | None = None,
    metrics_port: int | None = None,
) -> int:
    """Entry point of a replica process; returns the exit code (1 when start-up failed).

    ``cluster`` and ``metrics_port`` come from the command's composition root
    (:mod:`kubeserve.runtime.kubernetes.pod`) in a pod; see :func:`serve_replica`.
    """
    parser = argparse.ArgumentParser(prog="python -m kubeserve.runtime.replica")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(argv)
    config_file = os.environ.get(wire.REPLICA_CONFIG_FILE_ENV)
    source = config_file or wire.REPLICA_CONFIG_ENV
    try:
        if config_file:
            with open(config_file, "rb") as raw:
                config: wire.ReplicaConfig = json.load(raw)
        else:
            config = json.loads(os.environ[wire.REPLICA_CONFIG_ENV])
    except (KeyError, ValueError, OSError) as exc:
        print(f"replica: no valid config in {source}: {_error_text(exc)}", file=sys.stderr)
        return 1
    try:
        configure_logging(config, config.get("logging_config"), logs.output_from_environment())
    except (OSError, ValueError) as exc:
        print(f"replica: cannot set up its log: {_error_text(exc)}", file=sys.stderr)
        return 1
    controller_url = os.environ.get(wire.CONTROLLER_URL_ENV) or None
    sync_in_threadpool = os.environ.get(SYNC_IN_THREADPOOL_ENV, "1") != "0"
    try:
        secret = channel.take_secret()
    except ValueError as exc:
        print(f"replica: {exc}", file=sys.stderr)
        return 1
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(
                serve_replica(
                    config,
                    options.host,
                    options.port,
                    controller_url,
                    secret,
                    sync_in_threadpool=sync_in_threadpool,
                    cluster=cluster,
                    metrics_port=metrics_port,
                )
            )
    except ReplicaStartupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        traceback.print_exc()
        print(f"replica: cannot listen on {options.host}:{options.port}: {exc}", file=sys.stderr)
        return 1
    return 0
