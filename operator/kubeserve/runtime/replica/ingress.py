"""User traffic to a replica (a proxy's ``INGRESS`` connection): HTTP, ASGI and WebSocket.

Every path goes to the user's code (a path under ``/-/`` is the user's too): the ingress's ASGI
app when the deployment is one (:mod:`.asgi`, which also serves WebSockets), else its
``__call__``, whose result becomes the response (a Starlette response is sent as it is, a
:class:`~kubeserve.sdk.http.StreamingResponse` chunked). A request counts as ongoing from its
start to the last chunk of its answer (a WebSocket: for as long as it is open).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from _thread import allocate_lock
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

from kubeserve.runtime import tracing
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
    StreamedResponse,
    internal_error,
    text_response,
)
from kubeserve.runtime.replica.state import ReplicaState
from kubeserve.runtime.replica.user_code import (
    invoke,
    is_async_callable,
    is_plain_function,
    iterate,
    takes_arguments,
)
from kubeserve.runtime.thread_hop import Finisher, current_hop, loop_hop, run_sync
from kubeserve.runtime.websocket import WebSocketSession
from kubeserve.sdk import context
from kubeserve.sdk.http import StreamingResponse, to_response
from kubeserve.sdk.ingress import asgi_app_of

if TYPE_CHECKING:
    from kubeserve.runtime.replica.http import _Connection
    from kubeserve.runtime.tracer import Tracer

__all__ = ["Ingress"]

log = logging.getLogger("kubeserve.replica")


class Ingress:
    """Serves user traffic with the user's code held by a :class:`ReplicaState`."""

    def __init__(self, state: ReplicaState) -> None:
        self._state = state
        user = state.user
        self._http_target = user.method("__call__")
        #: Ray calls an HTTP handler that declares no parameter without the request
        self._http_takes_request = self._http_target is None or takes_arguments(self._http_target)
        #: how the handler is called, decided once (not asked at every request): awaited here
        #: (``async def``), or through :meth:`ReplicaState.run` (a plain ``def``: a worker
        #: thread; a generator function: its steps are run where the response is iterated)
        self._http_async = self._http_target is not None and is_async_callable(self._http_target)
        self._http_plain = (
            self._http_target is not None
            and is_plain_function(self._http_target)
            and state.run is invoke
        )
        self._asgi = None if user.is_function else asgi_app_of(user.target)
        #: the ``async def __call__`` of a deployment that is no ASGI app, or None
        self._plain_async = self._http_target if self._http_async and self._asgi is None else None
        #: a request may be stepped by hand, outside a task (see ``ReplicaHttpServer``), only
        #: when no user coroutine runs in its steps: a plain ``def`` runs on a worker thread and
        #: an ASGI app in a task of its own
        self._by_hand = self._http_plain or self._asgi is not None or self._http_target is None
        self.lifespan = Lifespan(self._asgi) if self._asgi is not None else None
        #: ``http_options.root_path`` (a reverse proxy in front strips it), then the route
        #: prefix: the ASGI ``root_path``, as Ray's proxy sets it
        self._mount = str(state.config.get("http_root_path") or "")
        self._root_path = self._mount + root_path_of(state.config.get("route_prefix"))
        if self._asgi is None and self._http_target is not None and self._http_takes_request:
            prepare_asgi()  # the first request must not pay for making Starlette's request type
        #: the ``route`` label of HTTP requests (Ray's: the application's route prefix); handle
        #: calls have none
        self._route = state.config.get("route_prefix") or ""

    def set_route_prefix(self, route_prefix: str) -> None:
        """The application's route moved (no restart): what ASGI apps see in ``root_path``, and
        the ``route`` label, follow."""
        self._root_path = self._mount + root_path_of(route_prefix)
        self._route = route_prefix

    def steps_by_hand(self, request: HttpRequest) -> bool:
        """Whether ``request`` may run outside a task: False when the user's code is a coroutine
        (or an async generator), which gets the task Ray runs each request in, so
        ``asyncio.timeout``, a ``TaskGroup`` and the timeouts of aiohttp and anyio work. The
        same for every request: :attr:`by_hand` says it without a call."""
        return self._by_hand

    @property
    def by_hand(self) -> bool:
        """:meth:`steps_by_hand` of every request (``ReplicaHttpServer`` takes the bool)."""
        return self._by_hand

    async def handle(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        """User traffic (a proxy's ``INGRESS`` connection): every path goes to the user's code."""
        state = self._state
        started = self._admit()
        if started is None:
            refusal = state.refusal()
            assert refusal is not None
            return refusal
        status: int | str = 500
        streaming = False
        try:
            model_id = _enter_request(request, self._route)
            if tracing.ACTIVE is None:
                if self._plain_async is not None:  # _user_http's common case, one frame less
                    plain: HttpResponse | None = None
                    try:
                        if self._http_takes_request:
                            args = (user_request(request, self._root_path, self._mount),)
                            result = await self._plain_async(*args)
                        else:
                            result = await self._plain_async()
                        if type(result) is str:
                            plain = text_response(result.encode())
                    except Exception as exc:
                        plain = self._failed(exc, request, "request")
                    response = (
                        plain if plain is not None else await self._answer(result, request, started)
                    )
                else:
                    response = await self._user_http(request, started)
            else:
                response = await self._traced_http(tracing.ACTIVE, request, started)
            streaming = isinstance(response, StreamedResponse)
            status = response.status
            if model_id:
                state.tell_models(response)
            return response
        except asyncio.CancelledError as exc:  # the client left (see ReplicaHttpServer)
            status = "CANCELLED"  # Ray's access line, and its error count by exception type
            state.metrics_recorder.error(self._route, exc)
            raise
        finally:
            if not streaming:  # a stream is counted until its last chunk (see _stream)
                route = self._route
                state.finish(started, route, request.method, route, status, request.request_id)

    @property
    def plain(self) -> bool:
        """Whether :meth:`start_plain` may answer requests: ``__call__`` is a plain method run on
        a worker thread (Ray's default), of a deployment that is no ASGI app."""
        return self._http_plain and self._asgi is None

    def start_plain(
        self, request: HttpRequest, conn: _Connection, context: contextvars.Context
    ) -> bool:
        """:meth:`handle` for a plain ``__call__``, its common answer (a ``str``) written from the
        worker thread right after the call (:class:`_PlainAnswer`); False (nothing done) for a
        request it leaves to :meth:`handle`: traced, multiplexed, refused at capacity, or with a
        request id the compiled answer does not take. Runs ``_enter_request`` in ``context``,
        the request's own."""
        request_id = request.request_id
        if tracing.ACTIVE is not None or request.model_id or not request_id.isascii():
            return False
        started = self._admit()
        if started is None:
            return False
        conn.answering = True  # (until answered or resumed: see _Connection.answer_from_worker)
        answer = _PlainAnswer(self, request, conn, context, started)
        try:
            context.run(self._start_plain, request, answer)
        except Exception as exc:  # (making the user's request object failed) as handle(): a 500
            conn.resume(request, self.plain_rest(request, started, False, exc), context)
        return True

    def _admit(self) -> float | None:
        """:meth:`ReplicaState.admit`; at capacity, once more after the loop took in the
        answers worker threads have written meanwhile (see :class:`_PlainAnswer`): a caller
        that got its answer may send the next request before the loop counted the last one
        done."""
        state = self._state
        started = state.admit()
        if started is None:
            hop = current_hop()
            if hop is not None and hop.drain_ready():
                started = state.admit()
        return started

    def _start_plain(self, request: HttpRequest, answer: _PlainAnswer) -> None:
        _enter_request(request, self._route)
        hop = loop_hop()
        target = self._http_target
        assert target is not None
        if self._http_takes_request:
            hop.run_finishing(answer, target, user_request(request, self._root_path, self._mount))
        else:
            hop.run_finishing(answer, target)

    def finish_plain(self, started: float, request: HttpRequest, status: int) -> None:
        """A request :meth:`start_plain` answered with a ``str`` is done."""
        route = self._route
        self._state.finish(started, route, request.method, route, status, request.request_id)

    async def plain_rest(
        self, request: HttpRequest, started: float, ok: bool, value: Any
    ) -> HttpResponse | StreamedResponse:
        """The rest of :meth:`handle` after a plain ``__call__`` :meth:`start_plain` ran
        returned ``value`` (``ok``) or raised it, when its answer is not written from the
        worker: anything but a ``str``, or an exception."""
        state = self._state
        status: int | str = 500
        streaming = False
        try:
            if not ok:
                response: HttpResponse | StreamedResponse = self._failed(value, request, "request")
            else:
                try:
                    if inspect.isawaitable(value):  # (see invoke)
                        value = await asyncio.ensure_future(value)
                except Exception as exc:
                    response = self._failed(exc, request, "request")
                else:
                    if type(value) is str:
                        response = text_response(value.encode())
                    else:
                        response = await self._answer(value, request, started)
            streaming = isinstance(response, StreamedResponse)
            status = response.status
            return response
        except asyncio.CancelledError as exc:
            status = "CANCELLED"
            state.metrics_recorder.error(self._route, exc)
            raise
        finally:
            if not streaming:
                route = self._route
                state.finish(started, route, request.method, route, status, request.request_id)

    async def handle_websocket(
        self, request: HttpRequest, session: WebSocketSession
    ) -> HttpResponse | None:
        """A WebSocket handshake on user traffic: the ingress's ASGI app serves it, counted as
        one ongoing request for as long as the socket is open. Refused (an HTTP answer) while
        draining or at ``max_ongoing_requests`` (both "unserved": the proxy tries elsewhere), and
        when the deployment is no ASGI ingress."""
        refusal = self._state.refusal()
        if refusal is not None:
            return refusal
        app = self._asgi
        if app is None:
            return HttpResponse(
                501,
                f"deployment {self._state.user.name!r} takes no WebSocket: only an ASGI ingress "
                "(@serve.ingress(app) with a websocket route) does".encode(),
                close=True,
            )
        started = self._state.begin()
        status = 500
        try:
            _enter_request(request, self._route)
            app_state = self.lifespan.state if self.lifespan is not None else None
            serving = run_websocket(
                app,
                websocket_scope(request, self._root_path, app_state, self._mount),
                session,
                request.request_id,
                functools.partial(self._state.metrics_recorder.error, self._route),
            )
            if tracing.ACTIVE is None:
                refusal = await serving
            else:
                refusal = await self._traced_websocket(tracing.ACTIVE, request, serving)
            status = 101 if refusal is None else refusal.status
            return refusal
        finally:
            route = self._route
            self._state.finish(started, route, "WEBSOCKET", route, status, request.request_id)

    async def _traced_http(
        self, tracer: Tracer, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        """:meth:`_user_http` inside the request's replica span, child of the proxy's (its
        ``traceparent`` header): the user's code runs in the span's context."""
        span = self._replica_span(tracer, request)
        with tracer.inside(span, end=False):
            response = await self._user_http(request, started)
        tracer.mark(span, response.status)
        if isinstance(response, StreamedResponse):  # the span ends with the stream
            response.chunks = tracer.streamed(span, response.chunks)
        else:
            span.end()
        return response

    async def _traced_websocket(
        self, tracer: Tracer, request: HttpRequest, serving: Awaitable[HttpResponse | None]
    ) -> HttpResponse | None:
        """A WebSocket served inside its replica span, which covers the socket's life (as
        Ray's replica span of a WebSocket does); its status is the handshake's answer."""
        span = self._replica_span(tracer, request)
        with tracer.inside(span, end=False):
            refusal = await serving
        tracer.end(span, 101 if refusal is None else refusal.status)
        return refusal

    def _replica_span(self, tracer: Tracer, request: HttpRequest) -> Any:
        """The replica span of a request (or a WebSocket), child of the proxy's span (the
        ``traceparent`` header the proxy forwarded)."""
        carrier = tracer.headers_carrier(request.headers)
        return tracer.replica_call(
            self._state.config, "__call__", request.request_id, carrier, route=self._route
        )

    async def _user_http(
        self, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        if self._asgi is not None:
            return await self._asgi_http(self._asgi, request, started)
        if self._http_target is None:
            return HttpResponse(
                404, f"deployment {self._state.user.name!r} has no __call__ method".encode()
            )
        try:
            args = (
                (user_request(request, self._root_path, self._mount),)
                if self._http_takes_request
                else ()
            )
            if self._http_async:
                result = await self._http_target(*args)
            elif self._http_plain:
                result = await run_sync(self._http_target, *args)
                if type(result) is not str and inspect.isawaitable(result):  # (see invoke)
                    result = await asyncio.ensure_future(result)
            else:
                result = await self._state.run(self._http_target, *args)
            if type(result) is str:  # the common case, without building a Response first
                return text_response(result.encode())
        except Exception as exc:
            return self._failed(exc, request, "request")
        return await self._answer(result, request, started)

    async def _answer(
        self, result: Any, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        """The response to what the user's ``__call__`` returned (other than a ``str``)."""
        try:
            if is_asgi_response(result):  # a Starlette/FastAPI response: sent as it is
                return await self._asgi_http(result, request, started)
            response = to_response(result)
        except Exception as exc:
            return self._failed(exc, request, "request")
        if isinstance(response, StreamingResponse):
            return await self._stream(request, response, started)
        return HttpResponse(
            response.status_code, response.body, response.headers, content_type=None
        )

    async def _asgi_http(
        self, app: Any, request: HttpRequest, started: float
    ) -> HttpResponse | StreamedResponse:
        """``app`` (the ingress's ASGI app, or a Starlette response) answers ``request``."""
        app_state = self.lifespan.state if self.lifespan is not None else None
        scope = http_scope(request, self._root_path, app_state, self._mount)
        try:
            response = await run_asgi(app, scope, request.body, request.request_id)
        except Exception as exc:
            return self._failed(exc, request, "request")
        if isinstance(response, StreamingResponse):
            return await self._stream(request, response, started)
        return response

    async def _stream(
        self, request: HttpRequest, response: StreamingResponse, started: float
    ) -> HttpResponse | StreamedResponse:
        """A chunked response. The first chunk is produced before the status line is sent, so
        a generator that fails at once still gives a 500; a later failure cuts the connection (the
        client sees an incomplete chunked body, never a clean end)."""
        if not hasattr(response.content, "__aiter__"):
            response.content = iterate(response.content, self._state.run)
        chunks = response.chunks()
        try:
            first: bytes | None = await anext(chunks)
        except StopAsyncIteration:
            first = None
        except Exception as exc:
            return self._failed(exc, request, "streamed response to")

        async def body() -> AsyncIterator[bytes]:
            try:
                if first:
                    yield first
                async for chunk in chunks:
                    yield chunk
            except Exception as exc:
                self._failed(exc, request, "streamed response to", "failed mid-body")
                raise
            finally:
                await chunks.aclose()
                route = self._route
                self._state.finish(
                    started, route, request.method, route, response.status_code, request.request_id
                )

        return StreamedResponse(response.status_code, response.headers, body())

    def _failed(
        self, exc: Exception, request: HttpRequest, what: str, how: str = "failed"
    ) -> HttpResponse:
        """Count and log the user's exception, and the 500 answering it. The client gets the
        request id only: an exception's text may hold secrets. The id finds the traceback in
        this replica's log."""
        self._state.metrics_recorder.error(self._route, exc)
        log.exception(
            "%s %s %s %s (request id %s)",
            what,
            request.method,
            request.path,
            how,
            request.request_id,
        )
        return internal_error(request.request_id)


def _enter_request(request: HttpRequest, route: str) -> str:
    """Make the request's id, route and multiplexed model id visible to the user's code, its log
    records and the handle calls it makes (each request runs in its own context copy, so this
    never leaks into another request); returns the model id ("" for none)."""
    model_id = request.model_id
    made = _new(RequestContext)  # context.new_request_context, written out: once per request
    fields = made.__dict__
    fields["request_id"] = request.request_id
    fields["multiplexed_model_id"] = model_id
    fields["route"] = route
    _request_context.set(made)
    return model_id


class _PlainAnswer(Finisher):
    """A request :meth:`Ingress.start_plain` started. Its ``str`` answer is formatted, sealed and
    written by the worker thread right after the call (:meth:`_Connection.answer_from_worker`);
    then, on the loop, the request is counted done (:meth:`ReplicaState.finish`), what the
    socket did not take is written, and the connection serves its next request
    (:meth:`_Connection.answered`). A ``str`` answer is the only one made on the worker, so
    both sides know from ``(ok, value)`` alone who answers; anything else is answered on the
    loop (:meth:`Ingress.plain_rest`). The loop's part may come before the worker's has
    returned (see :class:`~kubeserve.runtime.thread_hop.Finisher`): a turnstile (a lock taken
    without blocking; whoever finds it taken comes second) has the second of the two go on,
    and only it."""

    __slots__ = (
        "body", "conn", "context", "error", "ingress", "request", "rest", "started", "turnstile",
    )  # fmt: skip

    def __init__(
        self,
        ingress: Ingress,
        request: HttpRequest,
        conn: _Connection,
        context: contextvars.Context,
        started: float,
    ) -> None:
        self.ingress = ingress
        self.request = request
        self.conn = conn
        self.context = context
        self.started = started
        self.body = b""
        #: what the worker could not write (None: nothing written, the loop writes it all)
        self.rest: bytes | None = None
        self.error: Exception | None = None  # the answer's encoding failed: a 500
        self.turnstile = allocate_lock()

    def on_worker(self, ok: bool, value: Any) -> None:
        if not ok or type(value) is not str:
            return
        try:
            self.body = body = value.encode()
            self.rest = self.conn.answer_from_worker(200, _TEXT, body, self.request)
        except UnicodeEncodeError as exc:  # (lone surrogates) as the loop's path: a 500
            self.error = exc
        except Exception:  # (an answer the compiled formatting leaves to the loop's path)
            pass
        finally:
            if not self.turnstile.acquire(False):  # the loop's part is done: go on there
                self.conn.loop.call_soon_threadsafe(self._answered)

    def on_loop(self, ok: bool, value: Any) -> None:
        if not ok or type(value) is not str:
            request = self.request
            self.conn.resume(
                request,
                self.ingress.plain_rest(request, self.started, ok, value),
                self.context,
            )
            return
        if not self.turnstile.acquire(False):  # the worker's part is done
            self._answered()

    def _answered(self) -> None:
        request, error = self.request, self.error
        response = None
        if error is not None:
            response = self.ingress._failed(error, request, "request")
        elif self.rest is None:
            response = text_response(self.body)
        self.ingress.finish_plain(self.started, request, 200 if error is None else 500)
        self.conn.answered(request, self.rest or b"", response)


_TEXT = {"content-type": "text/plain; charset=utf-8"}
_new = object.__new__
RequestContext = context.RequestContext
_request_context = context.request_context
