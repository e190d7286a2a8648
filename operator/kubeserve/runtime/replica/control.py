"""Internal endpoints of a replica (a ``CONTROL`` connection): handle calls, health, reconfigure.

The endpoints of :mod:`kubeserve.runtime.wire` under ``/-/``: ``call/<method>`` and
``stream/<method>`` (handle calls, counted as ongoing like user requests, a streamed one until its
last frame), ``duplex/<method>`` (a gRPC client-streaming or bidirectional call: a streamed one
whose input arrives while it runs, :mod:`~kubeserve.runtime.replica.grpc_call`), ``healthz``
(the user's ``check_health``), ``metrics`` (the accounting the autoscaler reads), ``reconfigure``
(applies ``user_config`` without a restart, one at a time), and for custom request routers
``routing-stats`` and ``request-router/<class>``
(:mod:`~kubeserve.runtime.replica.router_class`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import pickle
import types
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from kubeserve.control.user_config import user_config_version
from kubeserve.runtime import tracing, wire
from kubeserve.runtime.replica.grpc_call import (
    grpc_answer,
    grpc_arguments,
    grpc_error,
    input_stream,
)
from kubeserve.runtime.replica.http import (
    HttpRequest,
    HttpResponse,
    StreamedResponse,
    typed_response,
)
from kubeserve.runtime.replica.router_class import router_class_answer, routing_stats
from kubeserve.runtime.replica.state import ReplicaState, shutting_down
from kubeserve.runtime.replica.user_code import (
    error_text,
    generator_not_streamed,
    invoke,
    is_async_callable,
    is_plain_function,
    iterate,
    not_a_generator,
)
from kubeserve.sdk import context
from kubeserve.sdk.ray_errors import task_error

#: what a handle call's method must not return (a generator is answered through a stream)
_GENERATORS = (types.GeneratorType, types.AsyncGeneratorType)

if TYPE_CHECKING:
    from kubeserve.runtime.tracer import Tracer

__all__ = ["Control"]

log = logging.getLogger("kubeserve.replica")

_PICKLE = "application/octet-stream"
#: a handle call: method, args, kwargs, multiplexed model id, gRPC context, trace context
_Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str, Any, Any]


class Control:
    """Answers the internal endpoints with the user's code held by a :class:`ReplicaState`.

    Owns ``user_config``, the last one applied (``applied`` at start), and its version, which
    every health answer reports (:mod:`kubeserve.control.user_config`): the replica is the one
    owner of what it applied, and a request to apply that version again changes nothing.
    """

    def __init__(
        self,
        state: ReplicaState,
        applied: Any,
        on_route_prefix: Callable[[str], None] | None = None,
    ) -> None:
        self._state = state
        self.user_config = applied
        self.user_config_version = user_config_version(applied)
        #: the route prefix the ingress serves under (a reconfigure may move it, with no restart)
        self.route_prefix = str(state.config.get("route_prefix") or "")
        self._on_route_prefix = on_route_prefix
        self._reconfigure_lock = asyncio.Lock()
        self._plain: dict[str, bool] = {}  # per method name: a plain def (see steps_by_hand)
        self._async: dict[str, bool] = {}  # per method name: an async one (see _call)

    def steps_by_hand(self, request: HttpRequest) -> bool:
        """Whether ``request`` may run outside a task (see ``ReplicaHttpServer``): only a handle
        call of a plain ``def`` (a worker thread runs it) and the metrics; anything that may run
        a user coroutine (an ``async def`` method, a stream, ``check_health``, ``reconfigure``)
        gets a task."""
        path = request.path
        if path.startswith(wire.CALL_PREFIX):
            name = path[len(wire.CALL_PREFIX) :]
            plain = self._plain.get(name)
            if plain is None:
                method = self._state.user.method(name)
                if method is None:
                    return True  # answered 404 by kubeserve's own code
                plain = self._plain[name] = is_plain_function(method) and self._state.run is invoke
            return plain
        return path == wire.METRICS_PATH

    async def handle(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        """Internal endpoints (a ``CONTROL`` connection): handle calls, health, reconfigure."""
        path = request.path
        if path.startswith(wire.CALL_PREFIX):
            if request.method != "POST":
                return HttpResponse(405, b"handle calls use POST")
            started = self._state.admit()
            if started is None:
                refusal = self._state.refusal()
                assert refusal is not None
                return refusal
            method_name = path[len(wire.CALL_PREFIX) :]
            outcome = "ERROR"
            try:
                answer = await self._call(request, method_name)
                outcome = "OK" if answer.status == 200 else "ERROR"
                return answer
            finally:
                self._state.finish(started, "", "CALL", method_name, outcome)
        if path.startswith(wire.STREAM_PREFIX):
            if request.method != "POST":
                return HttpResponse(405, b"handle calls use POST")
            if self._state.draining:
                return shutting_down()
            return await self._stream_call(request, path[len(wire.STREAM_PREFIX) :])
        if path.startswith(wire.DUPLEX_PREFIX) and request.inflow is not None:
            if self._state.draining:
                return shutting_down()
            return await self._duplex_call(request, path[len(wire.DUPLEX_PREFIX) :])
        if path == wire.HEALTHZ_PATH:
            return await self._healthz()
        if path == wire.METRICS_PATH:
            return HttpResponse(200, self._state.metrics().encode())
        if path == wire.ROUTING_STATS_PATH:
            return await routing_stats(self._state.user)
        if path.startswith(wire.REQUEST_ROUTER_PREFIX):
            return router_class_answer(path[len(wire.REQUEST_ROUTER_PREFIX) :])
        if path == wire.RECONFIGURE_PATH:
            if request.method != "POST":
                return HttpResponse(405, b"reconfigure uses POST")
            return await self._reconfigure(request)
        return HttpResponse(404, f"no internal endpoint {path}".encode())

    def _handle_call(self, request: HttpRequest, method_name: str) -> _Call | HttpResponse:
        """The method, arguments, multiplexed model id, gRPC context (None unless the gRPC
        proxy makes the call) and caller's trace context (None unless it traces) of a handle call
        (its options entered into the request context), or the answer refusing it."""
        method = self._state.user.method(method_name)
        if method is None:
            return HttpResponse(
                404, f"deployment {self._state.user.name!r} has no method {method_name!r}".encode()
            )
        try:
            # wire.decode_call_with_options, written out (the unpickled tuple and dicts are
            # this call's own: not copied)
            call = _loads(request.body)
            args, kwargs = call[0], call[1]
            options = call[2] if len(call) > 2 else _NO_OPTIONS
            if type(args) is not tuple or type(kwargs) is not dict or type(options) is not dict:
                args, kwargs, options = tuple(args), dict(kwargs), dict(options)
        except Exception as exc:
            return HttpResponse(400, f"undecodable handle call: {error_text(exc)}".encode())
        grpc = options.get("grpc")
        if grpc is not None:
            kwargs = grpc_arguments(method, kwargs, grpc)
        return method, args, kwargs, _enter_call(options), grpc, options.get(tracing.CALL_OPTION)

    async def _call(self, request: HttpRequest, method_name: str) -> HttpResponse:
        call = self._handle_call(request, method_name)
        if isinstance(call, HttpResponse):
            return call
        method, args, kwargs, model_id, grpc, trace = call
        is_async = self._async.get(method_name)
        if is_async is None:
            is_async = self._async[method_name] = is_async_callable(method)
        try:
            if tracing.ACTIVE is not None:
                result = await self._traced_run(tracing.ACTIVE, trace, method_name, call)
            elif is_async:  # what ReplicaState.run does with it, without its frame
                result = await method(*args, **kwargs)
            else:
                result = await self._state.run(method, *args, **kwargs)
            if isinstance(result, _GENERATORS):
                if isinstance(result, types.GeneratorType):
                    result.close()
                else:
                    await result.aclose()
                raise generator_not_streamed(method_name)
            # wire.encode_result, written out
            body = _dumps(result, _PROTOCOL) if grpc is None else grpc_answer(grpc, result)
        except Exception as exc:
            exc = exc if grpc is None else grpc_error(grpc, exc)
            self._state.metrics_recorder.error("", exc)
            log.info("handle call %s raised %s", method_name, error_text(exc))
            answer = HttpResponse(500, self._raised(exc, method_name), content_type=_PICKLE)
        else:
            answer = typed_response(200, body, _PICKLE)
        if model_id:
            self._state.tell_models(answer)
        return answer

    async def _traced_run(self, tracer: Tracer, trace: Any, method_name: str, call: _Call) -> Any:
        """Run a handle call inside its replica span, child of the caller's handle span
        (``trace``): the user's code runs in the span's context."""
        method, args, kwargs = call[:3]
        carrier = trace if isinstance(trace, dict) else None
        span = tracer.replica_call(self._state.config, method_name, _request_id(), carrier)
        with tracer.inside(span):
            return await self._state.run(method, *args, **kwargs)

    async def _traced_frames(
        self, tracer: Tracer, trace: Any, method_name: str, frames: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        """A streamed call's frames inside its replica span: the generator's steps run in the
        span's context, which ends with the stream."""
        carrier = trace if isinstance(trace, dict) else None
        span = tracer.replica_call(self._state.config, method_name, _request_id(), carrier)
        try:
            async for frame in tracer.streamed(span, frames):
                yield frame
        finally:
            await frames.aclose()

    async def _stream_call(
        self, request: HttpRequest, method_name: str
    ) -> HttpResponse | StreamedResponse:
        """A streamed handle call: the generator's items go out as frames as it yields them."""
        call = self._handle_call(request, method_name)
        if isinstance(call, HttpResponse):
            return call
        method, args, kwargs, model_id, grpc, trace = call
        started = self._state.begin()
        try:
            items = method(*args, **kwargs)
            if inspect.isawaitable(items):
                items = await items
            if not (inspect.isgenerator(items) or inspect.isasyncgen(items)):
                raise not_a_generator(method_name)
        except Exception as exc:
            return self._not_started(exc, started, "streamed handle call", method_name, grpc)
        frames = self._frames(items, started, method_name, grpc)
        if tracing.ACTIVE is not None:
            frames = self._traced_frames(tracing.ACTIVE, trace, method_name, frames)
        if not model_id:
            return StreamedResponse(200, {"content-type": _PICKLE}, frames)
        # The first frame before the head, so that the head names the models once the generator
        # began (it loads its model before its first item): _frames turns errors into frames.
        first = await anext(frames)
        streamed = StreamedResponse(200, {"content-type": _PICKLE}, _after(first, frames))
        self._state.tell_models(streamed)
        return streamed

    async def _duplex_call(
        self, request: HttpRequest, method_name: str
    ) -> HttpResponse | StreamedResponse:
        """A call whose input streams in (its first frame is the call, the messages follow):
        the method gets them as a ``gRPCInputStream`` and answers once (``"unary"`` in the
        call's options: a client-streaming method) or with a generator (bidirectional)."""
        assert request.inflow is not None
        kind, first = await request.inflow.next()
        if kind != wire.FRAME_ITEM:
            return HttpResponse(400, b"a duplex call begins with its call frame")
        request.body = first
        call = self._handle_call(request, method_name)
        if isinstance(call, HttpResponse):
            return call
        method, args, kwargs, _, grpc, _ = call  # (duplex calls are not traced)
        unary = bool(wire.decode_call_with_options(first)[2].get("unary"))
        started = self._state.begin()
        try:
            result = method(input_stream(request.inflow), *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            streamed = inspect.isgenerator(result) or inspect.isasyncgen(result)
            if streamed and unary:
                raise generator_not_streamed(method_name)
            if not streamed and not unary:
                raise not_a_generator(method_name)
        except Exception as exc:
            return self._not_started(exc, started, "duplex call", method_name, grpc)
        items = result if streamed else (result,)
        frames = self._frames(items, started, method_name, grpc)
        return StreamedResponse(200, {"content-type": _PICKLE}, frames)

    def _not_started(
        self, exc: Exception, started: float, what: str, method_name: str, grpc: Any
    ) -> HttpResponse:
        """The answer to a streamed call whose method raised before its first item."""
        exc = exc if grpc is None else grpc_error(grpc, exc)
        self._state.metrics_recorder.error("", exc)
        self._state.finish(started, "")
        log.info("%s %s raised %s", what, method_name, error_text(exc))
        return HttpResponse(500, self._raised(exc, method_name), content_type=_PICKLE)

    async def _frames(
        self, items: Any, started: float, method_name: str, grpc: Any = None
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for item in iterate(items, self._state.run):
                answer = wire.encode_result(item) if grpc is None else grpc_answer(grpc, item)
                yield wire.encode_frame(wire.FRAME_ITEM, answer)
            yield wire.encode_frame(wire.FRAME_END)
        except Exception as exc:
            exc = exc if grpc is None else grpc_error(grpc, exc)
            self._state.metrics_recorder.error("", exc)
            yield wire.encode_frame(wire.FRAME_ERROR, self._raised(exc, method_name))
        finally:
            self._state.finish(started, "")

    def _raised(self, exc: BaseException, method_name: str) -> bytes:
        """What a caller receives when ``method_name`` raised: a :class:`RayTaskError` naming this
        replica, which the caller raises as an instance of the cause's class too."""
        config = self._state.config
        where = f"ServeReplica:{config['app']}:{config['deployment']}"
        error = task_error(
            exc,
            f"{where}.{method_name}",
            proctitle=f"kubeserve::{where}.{method_name}",
            actor_repr=f"<{where} replica={config['replica_id']}>",
            actor_id=config["replica_id"],
        )
        return wire.encode_error(error)

    async def _healthz(self) -> HttpResponse:
        if self._state.draining:
            return HttpResponse(503, b"replica is shutting down")
        try:
            await self._state.user.check_health()
        except Exception as exc:
            return HttpResponse(503, error_text(exc).encode())
        return HttpResponse(
            200,
            wire.health_answer(self.user_config_version, self.route_prefix),
            content_type="application/json",
        )

    async def _reconfigure(self, request: HttpRequest) -> HttpResponse:
        try:
            payload = json.loads(request.body)
            user_config = payload["user_config"]
        except Exception as exc:
            return HttpResponse(
                400, f'body must be JSON {{"user_config": ...}}: {error_text(exc)}'.encode()
            )
        version = user_config_version(user_config)
        prefix = payload.get("route_prefix")
        if isinstance(prefix, str) and prefix != self.route_prefix:
            # The application's route moved: its ASGI root_path follows at once.
            self.route_prefix = prefix
            if self._on_route_prefix is not None:
                self._on_route_prefix(prefix)
        async with self._reconfigure_lock:
            if version != self.user_config_version:  # the same version again: already applied
                try:
                    await self._state.user.reconfigure(user_config)
                except Exception as exc:
                    log.exception("reconfigure failed")
                    return HttpResponse(500, error_text(exc).encode())
                self.user_config, self.user_config_version = user_config, version
        return HttpResponse(
            200, wire.health_answer(version, self.route_prefix), content_type="application/json"
        )


def _enter_call(options: dict[str, Any]) -> str:
    """The same for a handle call: the caller's request id and multiplexed model id (returned,
    "" for none)."""
    request_id, model_id = options.get("request_id"), options.get("model_id")
    if request_id or model_id:
        model_id = str(model_id or "")
        made = _new(RequestContext)  # context.new_request_context, written out
        fields = made.__dict__
        fields["request_id"] = str(request_id or "")
        fields["multiplexed_model_id"] = model_id
        fields["route"] = ""
        _request_context.set(made)
        return model_id
    return ""


_new = object.__new__
RequestContext = context.RequestContext
_request_context = context.request_context
_loads, _dumps, _PROTOCOL = pickle.loads, pickle.dumps, pickle.HIGHEST_PROTOCOL
#: the options of a call that has none (read only)
_NO_OPTIONS: dict[str, Any] = {}


def _request_id() -> str:
    """The id of the request a handle call serves (its caller's), "" when unknown."""
    current = context.request_context.get()
    return current.request_id if current is not None else ""


async def _after(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """``first``, then what ``rest`` yields; closing this closes ``rest``."""
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()
