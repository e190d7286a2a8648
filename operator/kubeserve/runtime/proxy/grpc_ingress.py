"""The gRPC ingress of a proxy: Ray Serve 2.60's gRPC proxy, on a listener of its own.

Started only when ``grpc_options.grpc_servicer_functions`` names servicer functions, so an
HTTP-only proxy never imports grpcio. What Ray documents, done the same way:

* each servicer function (``user_pb2_grpc.add_FooServicer_to_server``) is imported in the proxy
  and called with a stand-in servicer and a recorder, which keeps the method handlers it
  registers: their request deserializers (the user's message types) parse the requests on the
  replica (the proxy forwards the bytes it received), the servicer's methods never run here;
* a call of ``/pkg.Service/Method`` goes to the ingress deployment of the application the
  ``application`` metadata names (any application when only one has a route), as a handle call
  of the deployment's method ``Method`` with the request message; the replica answers with the
  :class:`~kubeserve.sdk.grpc_context.RayServegRPCContext` it was given when the method changed
  it (status code, details, trailing metadata; else ``None``: the proxy applies its own copy)
  and the response message already serialized, which is sent as is (no response serializer);
* ``request_id`` and ``multiplexed_model_id`` metadata reach the replica as the request id and
  the multiplexed model of the call; the request id comes back as a trailer;
* every kind of method: unary and server-streaming ones as handle calls; client-streaming and
  bidirectional ones as duplex calls (:data:`~kubeserve.runtime.wire.DUPLEX_PREFIX`) whose
  method gets the client's messages as a ``gRPCInputStream`` while it runs, as in Ray 2.60
  (a client-streaming method returns one message, a bidirectional one yields them); the
  built-in ``ray.serve.RayServeAPIService`` (``ListApplications``, ``Healthz``), answered by the
  proxy itself;
* server reflection (``grpc.reflection.v1alpha.ServerReflection``) when
  ``grpc_options.enable_reflection`` (Ray's default): it advertises the users' services (not the
  built-in one), described by the descriptors their ``*_pb2`` modules registered here;
* Ray's gRPC proxy metrics (``ray_serve_num_grpc_requests``, ``..._error_requests``,
  ``ray_serve_grpc_request_latency_ms``...: :class:`~kubeserve.runtime.metrics.GrpcProxyMetrics`);
* failures are status codes with Ray's details: NOT_FOUND for an unknown application,
  RESOURCE_EXHAUSTED for back pressure, UNAVAILABLE when no replica can take the call,
  DEADLINE_EXCEEDED past ``grpc_options.request_timeout_s``, the code a method set before it
  raised, else INTERNAL with the error (truncated to fit a trailer).

With the native data path (``native``: the private socket's path), the
``kubeserve-fastpath`` process owns ``grpc_options.port`` and serves the common unary call
itself (``native/src/grpc.rs``): this server listens on a private unix socket (in the proxy's
0700 directory, so no other local process reaches it behind the native front) for the calls it
hands over whole (HTTP/2 stream by stream), and answers ``kubeserve.internal.NativeRelay/Answer``,
the replica answers only Python reads (a changed context, an error), signed by the native
process with the data-plane secret. :meth:`GrpcIngress.native_methods` gives it each unary
method's call pickle as a template whose holes it fills, so a replica gets the very bytes this
ingress sends.

Calls reach replicas through a :class:`~kubeserve.runtime.handle_client.HandleClient` sharing
the proxy's router, so HTTP and gRPC requests are counted against the same
``max_ongoing_requests`` and reported to the autoscaler together.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import importlib
import logging
import pickle
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from kubeserve.runtime import tracing
from kubeserve.runtime.discovery import SnapshotCallback
from kubeserve.runtime.handle_client import HandleClient, remote_error
from kubeserve.runtime.http1 import new_request_id
from kubeserve.runtime.logs import AccessLog
from kubeserve.runtime.metrics import GrpcProxyMetrics
from kubeserve.runtime.router import Router
from kubeserve.runtime.wire import Snapshot, decode_grpc_answer, decode_result
from kubeserve.sdk import context
from kubeserve.sdk.errors import BackPressureError, DeploymentUnavailableError
from kubeserve.sdk.grpc_context import GrpcStatusError, RayServegRPCContext

if TYPE_CHECKING:
    from kubeserve.runtime.tracer import Tracer

__all__ = ["GrpcIngress", "GrpcOptions", "load_services"]

log = logging.getLogger(__name__)

#: The service every Serve gRPC proxy answers itself.
SERVE_API_SERVICE = "ray.serve.RayServeAPIService"
#: Ray's limit on status details, so that a long traceback still fits in the trailers.
MAX_DETAILS = 4096
#: Ray's message size limit, both ways (gRPC's own default is 4 MiB received).
MAX_MESSAGE_BYTES = 2 * 1024 * 1024 * 1024 - 1
#: What ``Healthz`` answers when the proxy is ready (Ray's words).
HEALTHY_MESSAGE = "success"
#: The private service answering, for the native gRPC front, replica answers only Python reads.
NATIVE_RELAY_SERVICE = "kubeserve.internal.NativeRelay"
#: What grpc core's insecure listener gives as a call's auth context (the native front's calls
#: arrive over plain HTTP/2 too).
INSECURE_AUTH = {"transport_security_type": [b"insecure"], "security_level": [b"TSI_SECURITY_NONE"]}
LIST_APPLICATIONS = f"/{SERVE_API_SERVICE}/ListApplications"
HEALTHZ = f"/{SERVE_API_SERVICE}/Healthz"

Services = dict[str, dict[str, grpc.RpcMethodHandler]]


@dataclass(frozen=True)
class GrpcOptions:
    """``grpc_options`` as the proxy applies them (fixed for the life of the process)."""

    port: int
    servicer_functions: tuple[str, ...]
    request_timeout_s: float | None = None
    enable_reflection: bool = True


class _Recorder:
    """Stands in for the server a servicer function adds its handlers to, and keeps them."""

    def __init__(self) -> None:
        self.services: Services = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        for handler in handlers:
            for full_name, method in getattr(handler, "_method_handlers", {}).items():
                service, _, name = full_name.lstrip("/").partition("/")
                self.services.setdefault(service, {}).setdefault(name, method)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.services.setdefault(service, {}).update(handlers)


class _AnyServicer:
    """The servicer handed to servicer functions: every method exists and is never called."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def unused(*args: Any) -> Any:
            raise NotImplementedError(name)

        return unused


def load_services(servicer_functions: Sequence[str]) -> Services:
    """Import each ``module.add_XServicer_to_server`` and record the methods it registers.

    Raises ``ImportError``/``AttributeError``/``TypeError`` naming the function that failed: the
    modules must be importable in the proxy process, as in Ray.
    """
    recorder = _Recorder()
    for path in servicer_functions:
        module_name, _, attr = path.replace(":", ".").rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), attr)
            function(_AnyServicer(), recorder)
        except Exception as exc:
            raise type(exc)(f"grpc_servicer_functions: {path}: {exc}") from exc
    return recorder.services


class _StaticSource:
    """The handle client's endpoint source: the proxy's discovery feeds it (:meth:`apply`)."""

    async def start(self, on_update: SnapshotCallback) -> None:
        return None

    async def close(self) -> None:
        return None


class GrpcIngress:
    """A grpc.aio server answering the recorded services by calling ingress deployments.

    Owns its server and its :class:`HandleClient` (whose router is the proxy's: the proxy's
    discovery updates it). ``apps`` (application -> ingress deployment) is replaced whole by
    :meth:`apply`, on the loop, never mutated.
    """

    def __init__(
        self,
        host: str,
        options: GrpcOptions,
        services: Services,
        *,
        secret: bytes,
        router: Router,
        access_log: AccessLog | None = None,
        metrics: GrpcProxyMetrics | None = None,
        native: str | None = None,
    ) -> None:
        """``native``: behind the native gRPC front, on this private unix socket path."""
        self.native = native is not None
        self._socket = native
        self._secret = secret
        if native is not None:
            host, options = (
                "127.0.0.1",
                GrpcOptions(
                    0,
                    options.servicer_functions,
                    options.request_timeout_s,
                    options.enable_reflection,
                ),
            )
        self.host = host
        self.options = options
        self.port = options.port
        self.services = services
        self.access_log = access_log
        self.metrics = metrics or GrpcProxyMetrics()
        self.apps: dict[str, str] = {}
        self.ready = False
        self.client = HandleClient(None, secret=secret, router=router, source=_StaticSource())
        self._server: grpc.aio.Server | None = None
        #: the auth context, peer identities and identity key of every call (see ``_begin``)
        self._security: tuple[dict[str, Any], Any, Any] | None = None

    def apply(self, snapshot: Snapshot) -> None:
        """A new discovery snapshot (after the proxy's router took it)."""
        self.apps = {route["app"]: route["deployment"] for route in snapshot["routes"]}
        self.client.forget_gone(snapshot)
        self.ready = True

    async def start(self) -> None:
        await self.client.start()
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        for service, methods in self._handlers().items():
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, methods),)
            )
            server.add_registered_method_handlers(service, methods)
        if self.options.enable_reflection:
            _enable_reflection(server, sorted(set(self.services) - {SERVE_API_SERVICE}))
        host = "[::]" if self.host in ("0.0.0.0", "::", "") else self.host
        where = f"{host}:{self.options.port}" if self._socket is None else self.address
        self.port = server.add_insecure_port(where)
        if not self.port:
            raise OSError(f"cannot listen for gRPC on {where}")
        await server.start()
        self._server = server
        if self._socket is None:
            where = f"{host}:{self.port}"
        log.info("gRPC listening on %s for %s", where, sorted(self.services))

    @property
    def address(self) -> str:
        """Where this server listens, as the native front's ``--grpc-fallback`` takes it:
        ``unix:PATH`` behind the native front, else ``HOST:PORT``."""
        if self._socket is not None:
            return f"unix:{self._socket}"
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(1.0)
            self._server = None
        await self.client.close()

    # -- handlers -----------------------------------------------------------------------------

    def _handlers(self) -> Services:
        handlers: Services = {
            SERVE_API_SERVICE: {
                "ListApplications": grpc.unary_unary_rpc_method_handler(self._list_applications),
                "Healthz": grpc.unary_unary_rpc_method_handler(self._healthz),
            }
        }
        if self.native:
            handlers[NATIVE_RELAY_SERVICE] = {
                "Answer": grpc.unary_unary_rpc_method_handler(self._native_relay)
            }
        for service, methods in self.services.items():
            if service in (SERVE_API_SERVICE, NATIVE_RELAY_SERVICE):
                continue
            ours = handlers.setdefault(service, {})
            for name, method in methods.items():
                ours[name] = self._method_handler(name, f"/{service}/{name}", method)
        return handlers

    def _method_handler(
        self, name: str, full: str, method: grpc.RpcMethodHandler
    ) -> grpc.RpcMethodHandler:
        """Ours for one recorded method. Neither serializer: requests stay bytes here and are
        parsed on the replica (:class:`_Unparsed`), answers come serialized from it."""
        parse = method.request_deserializer
        inputs = method.request_streaming
        tracer = tracing.ACTIVE  # set before the server starts: a call pays nothing when off
        if method.response_streaming:
            streamed = self._stream_handler(name, full, parse, inputs)
            if tracer is not None:
                streamed = self._traced_stream(tracer, full, streamed)
            if inputs:
                return grpc.stream_stream_rpc_method_handler(streamed)
            return grpc.unary_stream_rpc_method_handler(streamed)
        unary = self._unary_handler(name, full, parse, inputs)
        if tracer is not None:
            unary = self._traced_unary(tracer, full, unary)
        if inputs:
            return grpc.stream_unary_rpc_method_handler(unary)
        return grpc.unary_unary_rpc_method_handler(unary)

    async def _list_applications(self, request: bytes, grpc_context: Any) -> bytes:
        started = time.perf_counter()
        if not self.ready:
            grpc_context.set_code(grpc.StatusCode.UNAVAILABLE)
            grpc_context.set_details("Route table is not populated yet.")
        self._record(LIST_APPLICATIONS, LIST_APPLICATIONS, "", "", grpc_context.code(), started)
        # ListApplicationsResponse { repeated string application_names = 1; }
        return b"".join(_string_field(1, name) for name in self.apps)

    async def _healthz(self, request: bytes, grpc_context: Any) -> bytes:
        started = time.perf_counter()
        message = HEALTHY_MESSAGE
        if not self.ready:
            message = "Route table is not populated yet."
            grpc_context.set_code(grpc.StatusCode.UNAVAILABLE)
            grpc_context.set_details(message)
        self._record(HEALTHZ, HEALTHZ, "", "", grpc_context.code(), started)
        return _string_field(1, message)  # HealthzResponse { string message = 1; }

    def native_methods(self) -> dict[str, dict[str, Any]]:
        """What the native gRPC front serves: each unary and server-streaming method's name, call
        template (:func:`native_template`; a stream's call is the same pickle) and ``stream``."""
        methods: dict[str, dict[str, Any]] = {}
        for service, recorded in self.services.items():
            if service in (SERVE_API_SERVICE, NATIVE_RELAY_SERVICE):
                continue
            for name, method in recorded.items():
                if method.request_streaming:
                    continue
                template = native_template(name, method.request_deserializer)
                if template is not None:
                    methods[f"/{service}/{name}"] = {
                        "name": name,
                        "template": template,
                        "stream": bool(method.response_streaming),
                    }
        return methods

    async def _native_relay(self, request: bytes, grpc_context: Any) -> bytes:
        """A replica's answer the native front cannot read (a changed context, an error),
        answered as :meth:`_unary_handler` answers it; unsigned: as an unknown method.

        With a seventh field ``item``: one item of a server stream the native front serves,
        whose method changed its context: answered with the item's message and the context as
        trailers the native front ends the stream with (``x-kubeserve-code``, ``-details``, the
        trailing metadata), status OK; not counted (the native front counts the stream)."""
        metadata = dict(grpc_context.invocation_metadata())
        fields = str(metadata.get("x-kubeserve-relay", ""))
        signature = str(metadata.get("x-kubeserve-signature", ""))
        signed = b"kubeserve-grpc-relay\n" + fields.replace("\t", "\n").encode() + b"\n" + request
        expected = hmac.new(self._secret, signed, hashlib.sha256).hexdigest()
        parts = fields.split("\t")
        item = len(parts) == 7 and parts[6] == "item"
        if not hmac.compare_digest(expected, signature) or not (len(parts) == 6 or item):
            grpc_context.set_code(grpc.StatusCode.UNIMPLEMENTED)
            grpc_context.set_details("Method not found!")
            return b""
        if item:
            return _stream_item(request, grpc_context)
        full, app, key, request_id, status, elapsed_ms = parts[:6]
        deployment = key.rpartition("#")[2]
        started = time.perf_counter() - float(elapsed_ms) / 1000.0
        code = grpc.StatusCode.OK
        try:
            if status == "200":
                reply, payload = decode_grpc_answer(request)
                if reply is not None:
                    reply._set_on_grpc_context(grpc_context)
                code = grpc_context.code() or code
                return payload
            if status == "500":
                raise remote_error(decode_result(request), f"{key}.{full.rpartition('/')[2]}")
            raise DeploymentUnavailableError(
                f"a replica of {key} answered {status}: {request[:200]!r}"
            )
        except Exception as exc:
            code = self._fail(grpc_context, exc, request_id)
            return b""
        finally:
            self._done(full, app, deployment, code, started, request_id)

    def _unary_handler(
        self, method: str, full: str, parse: Parse, inputs: bool
    ) -> Callable[[Any, Any], Any]:
        """A method with one answer; ``inputs``: its request is the client's stream."""

        async def unary(request: Any, grpc_context: Any) -> bytes:
            call = self._begin(grpc_context)
            if isinstance(call, str):
                return self._not_found(grpc_context, call, full)
            app, deployment, ctx, model_id, request_id = call
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            self.metrics.in_flight += 1
            try:
                async with self._deadline():
                    if inputs:
                        reply, payload = await _only(
                            self.client.stream(
                                app,
                                deployment,
                                method,
                                (),
                                {},
                                model_id=model_id,
                                options={"grpc": ctx, "unary": True},
                                inputs=_unparsed_stream(parse, request),
                                decode=decode_grpc_answer,
                            )
                        )
                    else:
                        reply, payload = await self.client.call(
                            app,
                            deployment,
                            method,
                            (_Unparsed.of(parse, request),),
                            {},
                            model_id=model_id,
                            options={"grpc": ctx},
                            decode=decode_grpc_answer,
                        )
                (reply or ctx)._set_on_grpc_context(grpc_context)
                code = grpc_context.code() or code
                return payload  # type: ignore[no-any-return]
            except asyncio.CancelledError:
                # the client cancelled (grpc.aio cancels this task): the replica's connection was
                # closed by the handle client, which cancels the method there; counted as Ray does
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:
                code = self._fail(grpc_context, exc, request_id)
                return b""
            finally:
                self.metrics.in_flight -= 1
                self._done(full, app, deployment, code, started, request_id)

        return unary

    def _stream_handler(
        self, method: str, full: str, parse: Parse, inputs: bool
    ) -> Callable[[Any, Any], Any]:
        """A server-streaming method; ``inputs``: bidirectional (its request is the client's
        stream, sent to the replica while the answers come back)."""

        async def streamed(request: Any, grpc_context: Any) -> AsyncIterator[bytes]:
            call = self._begin(grpc_context)
            if isinstance(call, str):
                self._not_found(grpc_context, call, full)
                return
            app, deployment, ctx, model_id, request_id = call
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            self.metrics.in_flight += 1
            ctx._set_on_grpc_context(grpc_context)  # the request id trailer, once
            # The deadline is armed around each wait for the replica's next item, never across
            # the yield: a timeout firing while the generator is suspended there would cancel
            # grpc's own write, outside this block, and the stream would run on past it.
            timeout_s = self.options.request_timeout_s
            deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
            items = self.client.stream(
                app,
                deployment,
                method,
                () if inputs else (_Unparsed.of(parse, request),),
                {},
                model_id=model_id,
                options={"grpc": ctx},
                inputs=_unparsed_stream(parse, request) if inputs else None,
                decode=decode_grpc_answer,
            )
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            reply, payload = await anext(items)
                    except StopAsyncIteration:
                        break
                    if reply is not None:  # the method changed the context
                        reply._set_on_grpc_context(grpc_context)
                    yield payload
                code = grpc_context.code() or code
            except Exception as exc:
                code = self._fail(grpc_context, exc, request_id)
            finally:
                await items.aclose()
                self.metrics.in_flight -= 1
                self._done(full, app, deployment, code, started, request_id)

        return streamed

    def _traced_unary(
        self, tracer: Tracer, full: str, handler: Callable[[Any, Any], Any]
    ) -> Callable[[Any, Any], Any]:
        """``handler`` inside the call's proxy span (:meth:`_span`)."""

        async def traced(request: Any, grpc_context: Any) -> Any:
            span = self._span(tracer, full, grpc_context)
            if span is None:  # an unknown application: answered NOT_FOUND, as Ray, no span
                return await handler(request, grpc_context)
            try:
                with tracer.inside(span, end=False):
                    return await handler(request, grpc_context)
            finally:
                tracer.end_rpc(span, grpc_context.code() or grpc.StatusCode.OK, _current_id())

        return traced

    def _traced_stream(
        self, tracer: Tracer, full: str, handler: Callable[[Any, Any], Any]
    ) -> Callable[[Any, Any], Any]:
        """A streaming ``handler`` inside the call's proxy span, which ends with the stream."""

        async def traced(request: Any, grpc_context: Any) -> AsyncIterator[bytes]:
            span = self._span(tracer, full, grpc_context)
            if span is None:
                async for item in handler(request, grpc_context):
                    yield item
                return
            try:
                with tracer.inside(span, end=False):
                    async for item in handler(request, grpc_context):
                        yield item
            finally:
                tracer.end_rpc(span, grpc_context.code() or grpc.StatusCode.OK, _current_id())

        return traced

    def _span(self, tracer: Tracer, full: str, grpc_context: Any) -> Any:
        """The proxy span of a call of ``full`` (Ray's ``proxy_grpc_request``), child of the
        client's ``traceparent`` metadata; None when no application takes the call. Its context
        is current while the call runs, so the handle call to the replica (a ``route_to_replica``
        span, as in Ray's proxy) and the replica's span are its descendants."""
        metadata = grpc_context.invocation_metadata()
        target = self._target(next((v for k, v in metadata if k == "application"), ""))
        if target is None:
            return None
        return tracer.proxy_rpc(metadata, full, *target)

    def _target(self, app_name: str) -> tuple[str, str] | None:
        """The application and ingress deployment a call naming ``app_name`` goes to (any
        application when there is only one)."""
        apps = self.apps
        if len(apps) == 1:
            return next(iter(apps.items()))
        if app_name in apps:
            return app_name, apps[app_name]
        return None

    def _deadline(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """``grpc_options.request_timeout_s`` around a call (nothing to arm without one)."""
        timeout_s = self.options.request_timeout_s
        return _NO_DEADLINE if timeout_s is None else asyncio.timeout(timeout_s)

    def _begin(self, grpc_context: Any) -> _Call | str:
        """The call's application, ingress deployment, context, model id and request id (the
        request context entered), or the application name that matched nothing."""
        metadata = [(m[0], m[1]) for m in grpc_context.invocation_metadata()]
        app_name = request_id = model_id = ""
        for key, value in metadata:
            if key == "application":
                app_name = value
            elif key == "request_id":
                request_id = value
            elif key == "multiplexed_model_id":
                model_id = value
        target = self._target(app_name)
        if target is None:
            return app_name
        app, deployment = target
        request_id = request_id or new_request_id().decode("ascii")
        security = self._security
        if security is None:
            # Every call arrives over the same insecure listener: the same auth context and no
            # peer identity, so they are read once, not per call.
            security = self._security = (
                dict(grpc_context.auth_context()),
                grpc_context.peer_identities(),
                grpc_context.peer_identity_key(),
            )
        ctx = RayServegRPCContext._of_new_call(metadata, request_id, grpc_context.peer(), security)
        context.request_context.set(context.RequestContext(request_id, model_id, app))
        return app, deployment, ctx, model_id, request_id

    def _not_found(self, grpc_context: Any, app_name: str, full: str) -> bytes:
        wanted = (
            f"Application '{app_name}' not found." if app_name else "Application metadata not set."
        )
        grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
        grpc_context.set_details(
            f"{wanted} Ping /{SERVE_API_SERVICE}/ListApplications for available applications."
        )
        self._done(full, "", "", grpc.StatusCode.NOT_FOUND, time.perf_counter(), "")
        return b""

    def _fail(self, grpc_context: Any, exc: BaseException, request_id: str) -> Any:
        """Set the status of a failed call (unless the method's own is set); returns it."""
        code, details = grpc_status(exc, self.options.request_timeout_s, request_id)
        if not grpc_context.code():
            grpc_context.set_code(code)
        if not grpc_context.details():
            grpc_context.set_details(details)
        return grpc_context.code()

    def _done(
        self,
        full: str,
        app: str,
        deployment: str,
        code: Any,
        started: float,
        request_id: str,
    ) -> None:
        """Log and count a call that was answered ``code``."""
        latency_ms = self._record(full, app, app, deployment, code, started)
        if self.access_log is not None:
            self.access_log.add(full, app, code.name, latency_ms, request_id)

    def _record(
        self, full: str, route: str, app: str, deployment: str, code: Any, started: float
    ) -> float:
        """Count a call in the proxy's metrics; returns its latency (ms). ``route``: as Ray
        labels it, the application (the built-in service's calls: their method)."""
        latency_ms = (time.perf_counter() - started) * 1000.0
        code = code or grpc.StatusCode.OK
        self.metrics.record(
            full, route, app, deployment, code.name, code is not grpc.StatusCode.OK, latency_ms
        )
        return latency_ms


#: A routed call: application, ingress deployment, context, multiplexed model id, request id.
_Call = tuple[str, str, RayServegRPCContext, str, str]

#: A request message parser (``Message.FromString`` of the method's request type), or None.
Parse = Callable[[bytes], Any] | None

_NO_DEADLINE: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()


class _Unparsed:
    """A request message as the client sent it, pickled as a call of its parser: it is parsed
    once, on the replica, instead of parsed here and serialized again for the hop."""

    __slots__ = ("data", "parse")

    def __init__(self, parse: Callable[[bytes], Any], data: bytes) -> None:
        self.parse = parse
        self.data = data

    @staticmethod
    def of(parse: Parse, data: bytes) -> Any:
        return data if parse is None else _Unparsed(parse, data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.parse, (self.data,))


async def _unparsed_stream(parse: Parse, requests: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    async for data in requests:
        yield _Unparsed.of(parse, data)


async def _only(items: AsyncGenerator[Any, None]) -> Any:
    """The one item of a client-streaming call's answer (the call's stream closed after it)."""
    try:
        async for item in items:
            return item
        raise RuntimeError("the replica sent no answer")
    finally:
        await items.aclose()


def _stream_item(answer: bytes, grpc_context: Any) -> bytes:
    """One item of a natively served stream (:meth:`GrpcIngress._native_relay`): its message,
    and its context as trailers (status OK: a code set mid-stream is the stream's, at its end)."""
    reply, payload = decode_grpc_answer(answer)
    if reply is not None:
        trailers = list(reply._trailing_metadata)
        if reply._code:
            trailers.append(("x-kubeserve-code", str(reply._code.value[0])))
        if reply._details:  # as grpc-message spells it (percent-encoded UTF-8)
            encoded = "".join(
                chr(b) if 0x20 <= b < 0x7F and b != 0x25 else f"%{b:02X}"
                for b in str(reply._details).encode()
            )
            trailers.append(("x-kubeserve-details", encoded))
        grpc_context.set_trailing_metadata(tuple(trailers))
    return payload


def _current_id() -> str:
    """The request id of the call served in this context (set by ``_begin``)."""
    current = context.request_context.get()
    return current.request_id if current is not None else ""


def grpc_status(
    exc: BaseException, timeout_s: float | None, request_id: str
) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that failed with ``exc`` (Ray's mapping)."""
    if isinstance(exc, TimeoutError):
        shown = f"Request timed out after {timeout_s}s." if timeout_s else "Request timed out."
        return grpc.StatusCode.DEADLINE_EXCEEDED, shown
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED, f"Client for request {request_id} disconnected."
    if isinstance(exc, BackPressureError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, GrpcStatusError):
        details = exc.grpc_details or str(exc.original_exception)
        return exc.grpc_code or grpc.StatusCode.UNKNOWN, _truncated(details)
    if isinstance(exc, DeploymentUnavailableError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    log.warning("gRPC request %s failed: %s", request_id, exc)
    return grpc.StatusCode.INTERNAL, _truncated(str(exc))


def _truncated(text: str) -> str:
    if len(text) <= MAX_DETAILS:
        return text
    notice = "... [truncated]"
    return text[: MAX_DETAILS - len(notice)] + notice


def _enable_reflection(server: grpc.aio.Server, services: list[str]) -> None:
    """Answer the reflection service on ``server`` for ``services`` (and itself), as Ray does."""
    from grpc_reflection.v1alpha import reflection

    advertised = [*services, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(advertised, server)
    log.info("gRPC server reflection advertises %s", advertised)


#: The holes of a native call template (:func:`native_template`), each a marker long enough to
#: be pickled with a 4-byte length (``BINUNICODE``/``BINBYTES``).
_HOLES = {
    name: "\x00kubeserve-native-hole-" + name + "." * 300
    for name in ("metadata", "peer", "request_id")
}
_DATA_HOLE = b"\x00kubeserve-native-hole-data" + b"." * 300


def native_template(method: str, parse: Parse) -> list[str] | None:
    """The body of ``/-/call/<method>`` the unary handler sends, cut at its per-call parts: hex
    strings of pickle bytes and the names of the holes between them (``data``: the request
    message as BINBYTES; ``metadata``: the invocation metadata as a list of (str, str) tuples;
    ``peer``, ``request_id``: BINUNICODE strings). Pickle protocol 3, whose opcodes carry no
    frame lengths, so a hole's encoding may be any length. None when it cannot be made."""
    ctx = RayServegRPCContext._of_new_call(
        [], _HOLES["request_id"], _HOLES["peer"], (INSECURE_AUTH, None, None)
    )
    ctx._invocation_metadata = _HOLES["metadata"]  # type: ignore[assignment]
    call: tuple[Any, ...] = (
        (_Unparsed.of(parse, _DATA_HOLE),),
        {},
        {"grpc": ctx, "request_id": _HOLES["request_id"]},
    )
    try:
        body = pickle.dumps(call, protocol=3)
    except Exception:
        return None
    markers = {b"B" + struct.pack("<I", len(_DATA_HOLE)) + _DATA_HOLE: "data"}
    for name, text in _HOLES.items():
        data = text.encode()
        markers[b"X" + struct.pack("<I", len(data)) + data] = name
    parts: list[str] = []
    start = 0
    while True:
        found = [(body.find(m, start), m) for m in markers]
        found = [(at, m) for at, m in found if at >= 0]
        if not found:
            break
        at, marker = min(found)
        parts.append(body[start:at].hex())
        parts.append(markers[marker])
        start = at + len(marker)
    parts.append(body[start:].hex())
    if sorted(set(parts) & {"data", "metadata", "peer", "request_id"}) != [
        "data",
        "metadata",
        "peer",
        "request_id",
    ]:
        return None
    return [part for part in parts if part]


def _string_field(number: int, text: str) -> bytes:
    """A protobuf length-delimited field (the built-in service's messages are this simple)."""
    data = text.encode()
    return bytes([number << 3 | 2]) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
