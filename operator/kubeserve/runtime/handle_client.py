"""Carries :class:`~kubeserve.sdk.handle.DeploymentHandle` calls to replicas.

Implements :class:`kubeserve.sdk.transport.HandleTransport`: the router picks a replica of the
target deployment (same policy and caps as the proxy), the call goes out as
``POST /-/call/<method>`` with a :func:`~kubeserve.runtime.wire.encode_call` body over a pooled
keep-alive connection, and the answer is decoded (200) or re-raised (500). A call for a
multiplexed model goes where the router knows the model is loaded; the replica's answer names the
models it holds (:data:`~kubeserve.runtime.wire.MODELS_HEADER`), which the router records.

The client speaks HTTP/1.1 itself (``asyncio.Protocol`` + httptools) instead of going through an
HTTP client library, because a handle call sits inside a user request: a library request costs a
request object, a response object, header multidicts and several awaits per call. Here a call is
one write of a pre-formatted head plus the pickled body, and one future resolved by the parser.
The tricks, each marked where it is used:

* **Pre-formatted request head** per (replica, method): only ``Content-Length`` is filled in.
* **One future per call**, resolved from ``data_received``; no task per call.
* **Same-host unix socket** to a replica on this machine (:mod:`~kubeserve.runtime.local_socket`).

Every connection is a ``CONTROL`` channel (:mod:`~kubeserve.runtime.channel`): it proves the
instance's secret before the first call, so only the instance's processes can make handle calls.
* **Pooled keep-alive connections** per replica, LIFO (the warmest is reused); a call never waits
  for a connection: it takes an idle one or opens a new one (the router already caps calls in
  flight per replica at ``max_ongoing_requests``). Idle connections are swept before the
  replica's keep-alive timeout could close one under a call
  (:class:`~kubeserve.runtime.keepalive.PoolSweeper`).

Never twice: a call goes to another replica only when it was never sent (connecting or the
handshake failed, at most :data:`CONNECT_ATTEMPTS` replicas in all). Once written it is not re-sent
anywhere: a lost connection raises :class:`~kubeserve.sdk.errors.DeploymentUnavailableError` to the
caller, who knows whether the method is safe to call again; the client cannot know whether the
replica ran it.

Ownership: a :class:`HandleClient` owns its router, its endpoint source (which keeps the router
fresh) and its connection pools; one per process, installed with ``sdk.transport.set_transport``.
A pool whose replica left the snapshot is closed.
"""

from __future__ import annotations

import asyncio
import math
import pickle
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import httptools

from kubeserve.runtime import tracing
from kubeserve.runtime.channel import Role
from kubeserve.runtime.discovery import EndpointSource
from kubeserve.runtime.keepalive import (
    IdlePool,
    KeepAliveConnection,
    PoolSweeper,
    connect,
    pool_for,
)
from kubeserve.runtime.load_report import controller_links
from kubeserve.runtime.router import (
    BackPressure,
    CallInfo,
    NoReplicaAvailable,
    RoutedReplica,
    Router,
)
from kubeserve.runtime.sealing import FrameError, frame_failed
from kubeserve.runtime.wire import (
    CALL_PREFIX,
    DUPLEX_PREFIX,
    FRAME_END,
    FRAME_ERROR,
    FRAME_ITEM,
    MODELS_HEADER,
    STREAM_PREFIX,
    UNSERVED_AT_CAPACITY,
    UNSERVED_HEADER,
    FrameReader,
    Snapshot,
    decode_result,
    deployment_key,
    encode_call,
    encode_frame,
    encode_result,
)
from kubeserve.sdk import context
from kubeserve.sdk.errors import BackPressureError, DeploymentUnavailableError, ReplicaDiedError
from kubeserve.sdk.ray_errors import RayTaskError

_UNSERVED = UNSERVED_HEADER.encode()
#: the running loop, or None (``asyncio.get_running_loop`` without its RuntimeError)
_running_loop = asyncio._get_running_loop
_request_context = context.request_context
_dumps, _loads, _PICKLE_PROTOCOL = pickle.dumps, pickle.loads, pickle.HIGHEST_PROTOCOL
_MODELS = MODELS_HEADER.encode()

__all__ = ["HandleClient"]

#: How long opening a connection to a replica may take.
CONNECT_TIMEOUT_S = 10.0
#: Replicas tried for one call when connecting (or the handshake) fails: nothing was sent yet.
CONNECT_ATTEMPTS = 3


class _Unreachable(Exception):
    """The call never ran: the connection to a replica (or its handshake) failed, or the replica
    answered that it did not start it (it is shutting down)."""


class _AtCapacity(Exception):
    """The replica runs ``max_ongoing_requests`` calls already (for all its callers together)
    and did not start this one."""


#: First and longest pause before a call a full replica refused is tried again.
_BUSY_FIRST_WAIT_S = 0.005
_BUSY_MAX_WAIT_S = 0.1


class HandleClient:
    """A :class:`~kubeserve.sdk.transport.HandleTransport` over HTTP/1.1 keep-alive."""

    def __init__(
        self,
        controller_url: str | None = None,
        *,
        secret: bytes,
        assign_timeout_s: float | None = None,
        source: EndpointSource | None = None,
        router: Router | None = None,
        scope: str | None = None,
    ) -> None:
        """``assign_timeout_s``: how long a call may wait for a replica slot before
        :class:`DeploymentUnavailableError`; ``None`` (the default) waits as Ray's handles do,
        for a deployment scaled to zero to start a replica, say. ``scope``: the
        ``namespace/instance`` the client's load reports name (in a cluster)."""
        self.router = router or Router(secret=secret)
        self._secret = secret
        self._assign_timeout_s = assign_timeout_s
        #: the reporter tells the controller (local) or the operator (cluster) what waits here
        self._source, self._load_reporter = controller_links(
            controller_url,
            source,
            self.router,
            secret=secret,
            caller="a handle client",
            scope=scope,
        )
        self._pools: dict[str, _CallPool] = {}
        #: connections that carried a whole stream, for the next one (a duplex call's are not)
        self._stream_pools: dict[str, IdlePool[_StreamConnection]] = {}
        self._sweeper = PoolSweeper(self._pools)
        self._stream_sweeper = PoolSweeper(self._stream_pools)
        self._started = False

    def apply(self, snapshot: Snapshot) -> None:
        """Install a discovery snapshot (routes are a proxy concern; handles need replicas only)."""
        self.router.update(snapshot["deployments"])
        self.forget_gone(snapshot)

    def forget_gone(self, snapshot: Snapshot) -> None:
        """Close the pools of replicas ``snapshot`` no longer has (when the router is shared,
        its owner updates it)."""
        live = {ep["replica_id"] for d in snapshot["deployments"].values() for ep in d["replicas"]}
        for pools in (self._pools, self._stream_pools):
            for replica_id in [rid for rid in pools if rid not in live]:
                pools.pop(replica_id).close()

    async def start(self) -> None:
        self._started = True
        self._sweeper.start()
        self._stream_sweeper.start()
        if self._load_reporter is not None:
            self._load_reporter.start()
        await self._source.start(self.apply)

    async def close(self) -> None:
        self._started = False
        self._sweeper.stop()
        self._stream_sweeper.stop()
        if self._load_reporter is not None:
            await self._load_reporter.close()
        await self._source.close()
        for pools in (self._pools, self._stream_pools):
            for pool in pools.values():
                pool.close()
            pools.clear()

    async def call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
        options: dict[str, Any] | None = None,
        decode: Callable[[bytes], Any] = decode_result,
    ) -> Any:
        """``options``: more of what the call carries besides its arguments (a gRPC call's
        context: :mod:`kubeserve.runtime.replica.grpc_call`); ``decode``: what makes the answer
        of the replica's body (a gRPC call's is not a pickle). When the process traces, the call
        is a span, whose context the call carries (:mod:`kubeserve.runtime.tracing`)."""
        tracer = tracing.ACTIVE
        if tracer is not None and not (options and tracing.CALL_OPTION in options):
            with tracer.handle_span(*_handle_span(app, deployment, method)) as carrier:
                traced = {**(options or {}), tracing.CALL_OPTION: carrier}
                return await self.call(
                    app,
                    deployment,
                    method,
                    args,
                    kwargs,
                    model_id=model_id,
                    options=traced,
                    decode=decode,
                )
        # (_begin without its coroutine: a free slot's call awaits nothing before it is sent)
        key, payload, free = self._begin_now(app, deployment, args, kwargs, model_id, options)
        replica = free or await self._assign(key, model_id=model_id, call=(method, args, kwargs))
        return await self._send(key, method, payload, model_id, replica, decode)

    def start_call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        model_id: str = "",
    ) -> asyncio.Future[Any] | None:
        """:meth:`call`, started now on the running loop (this client's): a future of its
        result, or None when :meth:`call` itself must make it (the process traces, the client
        is not started, or the arguments do not pickle: :meth:`call` raises that on await).

        With a free slot and an idle pooled connection (the common case) the call is written
        here and now, and its future is resolved by the connection as the answer arrives
        (:class:`_PendingCall`): no task, no coroutine, no loop iteration before the request
        goes out or between the answer and its caller. Otherwise a task finishes the call
        (waiting for a slot, connecting), as :meth:`call` would."""
        if tracing.ACTIVE is not None or not self._started:
            return None
        key = f"{app}#{deployment}"  # deployment_key, written out
        # _call_options and encode_call, written out
        current = _request_context.get()
        request_id = current.request_id if current is not None else ""
        if model_id:
            options: dict[str, Any] | None = {"model_id": model_id}
            if request_id:
                options["request_id"] = request_id  # type: ignore[index]
        else:
            options = {"request_id": request_id} if request_id else None
        try:  # encoded first: arguments that cannot be pickled must not leave a slot taken
            payload = _dumps(
                (args, kwargs, options) if options else (args, kwargs), _PICKLE_PROTOCOL
            )
        except Exception:
            return None
        loop = _running_loop()
        if loop is None:  # not called on a loop: the caller's ordinary path
            return None
        replica = self.router.try_assign(key, None, model_id)
        if replica is not None:
            pool = self._pools.get(replica.replica_id)
            if pool is not None and pool.port == replica.port and pool.host == replica.host:
                conn = pool.take()
                if conn is not None:
                    pending = _PendingCall(loop=loop)
                    pending.call = (self, key, method, payload, model_id, replica, pool)
                    pending.conn = conn
                    pending.retry = None
                    conn.request(pool.head(method), payload, pending)
                    return pending
            # A task assigns again: one cancelled before its first step would hold this slot.
            self.router.release(replica)
        return loop.create_task(self._assign_and_send(key, method, args, kwargs, payload, model_id))

    async def _assign_and_send(
        self,
        key: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        payload: bytes,
        model_id: str,
    ) -> Any:
        """The rest of a call :meth:`start_call` could not write at once."""
        replica = await self._assign(key, model_id=model_id, call=(method, args, kwargs))
        return await self._send(key, method, payload, model_id, replica, decode_result)

    async def _send(
        self,
        key: str,
        method: str,
        payload: bytes,
        model_id: str,
        replica: RoutedReplica,
        decode: Callable[[bytes], Any],
        first: Exception | None = None,
    ) -> Any:
        """Send the call ``payload`` to ``replica`` (a slot it holds), elsewhere when it was not
        served there, and make its answer. ``first``: how the first attempt on ``replica``
        ended when it was made already (:class:`_AtCapacity` or :class:`_Unreachable`: a call
        :meth:`start_call` wrote that the replica did not serve)."""
        attempt = 1
        busy_wait = _BUSY_FIRST_WAIT_S
        deadline = (
            math.inf
            if self._assign_timeout_s is None
            else time.monotonic() + self._assign_timeout_s
        )
        while True:
            busy = False
            try:
                if first is not None:  # that attempt was made: what it came to, handled below
                    error, first = first, None
                    raise error
                pool = self._pools.get(replica.replica_id)
                if pool is None or pool.port != replica.port or pool.host != replica.host:
                    pool = self._pool(replica)
                status, body, models = await pool.call(method, payload)
                if models is not None:
                    self.router.note_models(replica, models)
                break
            except _AtCapacity:  # other callers fill it: wait for a slot, not counted as a failure
                busy = True
                if time.monotonic() >= deadline:
                    raise DeploymentUnavailableError(
                        f"every replica of {key} stayed at max_ongoing_requests for "
                        f"{self._assign_timeout_s} s"
                    ) from None
            except _Unreachable as exc:  # it did not run: another replica may take the call
                if self.router.retire(replica):  # on its way out: costs no attempt
                    pass
                elif attempt >= CONNECT_ATTEMPTS:
                    raise DeploymentUnavailableError(
                        f"no replica of {key} could be reached; the last, "
                        f"{replica.replica_id}: {exc}"
                    ) from exc.__cause__
                else:
                    attempt += 1
            except (OSError, TimeoutError) as exc:  # sent: the replica may have run it
                raise ReplicaDiedError(
                    f"replica {replica.replica_id} of {key} failed: {exc or type(exc).__name__}"
                ) from exc
            finally:
                self.router.release(replica)
            if busy:
                await asyncio.sleep(busy_wait * (0.5 + random.random()))
                busy_wait = min(busy_wait * 2, _BUSY_MAX_WAIT_S)
            replica = await self._assign(key, avoid=replica, model_id=model_id)
        if status == 200:
            return decode(body)
        if status == 500:
            raise remote_error(decode_result(body), f"{key}.{method}")
        raise DeploymentUnavailableError(
            f"replica {replica.replica_id} of {key} answered {status}: {body[:200]!r}"
        )

    async def stream(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
        options: dict[str, Any] | None = None,
        inputs: AsyncIterator[Any] | None = None,
        decode: Callable[[bytes], Any] = decode_result,
    ) -> AsyncGenerator[Any, None]:
        """A streamed call of a generator method: its items as the replica yields them.

        The call holds its replica slot until the stream ends (or the caller stops iterating,
        which closes the connection and so the replica's generator). It runs on a connection of
        its own, which goes back to a pool for the next stream to that replica once the stream
        was read to its end (else it is closed); a duplex call's connection is always closed.

        ``inputs``: a duplex call (:data:`~kubeserve.runtime.wire.DUPLEX_PREFIX`, gRPC client
        streams): each item ``inputs`` yields goes to the replica as it comes, while the answer
        streams back; the body ends when ``inputs`` does. ``decode``: as :meth:`call`'s, for
        each item.
        """
        tracer = tracing.ACTIVE
        if tracer is not None and not (options and tracing.CALL_OPTION in options):
            with tracer.handle_span(*_handle_span(app, deployment, method)) as carrier:
                traced = {**(options or {}), tracing.CALL_OPTION: carrier}
                async for item in self.stream(
                    app,
                    deployment,
                    method,
                    args,
                    kwargs,
                    model_id=model_id,
                    options=traced,
                    inputs=inputs,
                    decode=decode,
                ):
                    yield item
            return
        key, replica, payload = await self._begin(
            app, deployment, method, args, kwargs, model_id, options
        )
        conn: _StreamConnection | None = None
        pump: asyncio.Task[None] | None = None
        pool = pool_for(
            self._stream_pools,
            replica.replica_id,
            replica.host,
            replica.port,
            self._secret,
            IdlePool[_StreamConnection],
        )
        try:
            conn = pool.take() if inputs is None else None
            if conn is None:
                conn = await self._open_stream(key, replica)
            if inputs is None:
                conn.send(method, replica, payload)
            else:
                conn.send_duplex(method, replica, payload)
                pump = asyncio.ensure_future(conn.pump(inputs))
            async for item in conn.items(key, replica.replica_id, decode):
                if conn.models is not None:
                    self.router.note_models(replica, conn.models)
                    conn.models = None
                yield item
        finally:
            if pump is not None:
                pump.cancel()
            if conn is not None and conn.models is not None:
                self.router.note_models(replica, conn.models)
            self.router.release(replica)
            if conn is not None:
                conn.recycle(pool if pump is None else None)

    async def _open_stream(self, key: str, replica: RoutedReplica) -> _StreamConnection:
        """A new connection for a streamed call to ``replica``."""
        opening: Awaitable[_StreamConnection] = connect(
            _StreamConnection,
            replica.host,
            replica.port,
            Role.CONTROL,
            self._secret,
            replica.replica_id,
            CONNECT_TIMEOUT_S,
        )
        if asyncio.current_task() is None:
            # A handler the replica steps eagerly runs in no task until it first waits, and
            # the connect's timeout needs one (cancelling us cancels it too).
            opening = asyncio.ensure_future(opening)
        try:
            return await opening
        except (OSError, TimeoutError) as exc:
            raise DeploymentUnavailableError(
                f"replica {replica.replica_id} of {key} could not be reached: {exc}"
            ) from exc

    async def _begin(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        model_id: str,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, RoutedReplica, bytes]:
        """A call's deployment key, the replica slot it holds (release it!) and its body."""
        key, payload, free = self._begin_now(app, deployment, args, kwargs, model_id, options)
        replica = free or await self._assign(key, model_id=model_id, call=(method, args, kwargs))
        return key, replica, payload

    def _begin_now(
        self,
        app: str,
        deployment: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        model_id: str,
        options: dict[str, Any] | None,
    ) -> tuple[str, bytes, RoutedReplica | None]:
        """:meth:`_begin` without waiting: the key, the body and a free slot (None: wait for
        one with :meth:`_assign`)."""
        if not self._started:
            raise RuntimeError("HandleClient call before start()")
        key = deployment_key(app, deployment)
        # Encoded first: arguments that cannot be pickled must not leave a slot taken.
        payload = encode_call(args, kwargs, _call_options(model_id, options))
        # Fast path: a free slot needs no waiter future and no timer.
        return key, payload, self.router.try_assign(key, None, model_id)

    async def _assign(
        self,
        key: str,
        avoid: RoutedReplica | None = None,
        model_id: str = "",
        call: CallInfo | None = None,
    ) -> RoutedReplica:
        try:
            return await self.router.assign(key, self._assign_timeout_s, avoid, model_id, call)
        except BackPressure as exc:
            raise BackPressureError(str(exc)) from None
        except NoReplicaAvailable as exc:
            raise DeploymentUnavailableError(str(exc)) from None

    def _pool(self, replica: RoutedReplica) -> _CallPool:
        return pool_for(
            self._pools, replica.replica_id, replica.host, replica.port, self._secret, _CallPool
        )


class _CallPool(IdlePool["_CallConnection"]):
    """Idle keep-alive connections to one replica and the request heads sent to it."""

    __slots__ = ("heads",)

    def __init__(self, replica_id: str, host: str, port: int, secret: bytes) -> None:
        super().__init__(replica_id, host, port, secret)
        self.heads: dict[str, bytes] = {}

    def head(self, method: str) -> bytes:
        """``POST /-/call/<method>`` up to ``Content-Length: ``; formatted once per method."""
        head = self.heads.get(method)
        if head is None:
            head = self.heads[method] = (
                f"POST {CALL_PREFIX}{method} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Content-Type: application/octet-stream\r\nContent-Length: "
            ).encode("latin-1")
        return head

    async def call(self, method: str, body: bytes) -> tuple[int, bytes, bytes | None]:
        """One call: the answer's status, body and :data:`MODELS_HEADER` (``None`` when it has
        none); raises :class:`_Unreachable` when no byte of it could be sent."""
        conn = self.take()
        if conn is None:
            try:
                conn = await connect(
                    _CallConnection,
                    self.host,
                    self.port,
                    Role.CONTROL,
                    self.secret,
                    self.replica_id,
                    CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError) as exc:
                raise _Unreachable(str(exc) or type(exc).__name__) from exc
        try:
            status, answer, keep_alive = await conn.request(self.head(method), body)
            models = conn.models
        except BaseException:  # lost, or the caller was cancelled: the answer may still come
            conn.close()
            raise
        if keep_alive and conn.usable():
            self.put(conn)
        else:
            conn.close()
        if status == 503 and conn.unserved:
            if conn.unserved == UNSERVED_AT_CAPACITY:
                raise _AtCapacity()
            raise _Unreachable("the replica is shutting down and did not start the call")
        return status, answer, models


class _CallConnection(KeepAliveConnection):
    """One keep-alive connection to a replica carrying one call at a time.

    Invariant: ``waiter`` is set from the moment a request is written until its response is
    complete or the connection is lost; an idle connection has none.
    """

    def __init__(self) -> None:
        super().__init__()
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.body: list[bytes] = []
        #: the :data:`UNSERVED_HEADER` value of the answer ("" when the replica started the call)
        self.unserved = ""
        #: the :data:`MODELS_HEADER` value of the answer (a multiplexed call's), else None
        self.models: bytes | None = None
        self.in_message = False  # httptools holds part of an answer
        # Frames opened here, requests sealed here (see opens_frames), or None.
        self.opener: Any = None
        self.raw: asyncio.Transport | None = None
        self.seal_parts: Callable[[tuple[bytes, ...]], bytes] | None = None

    def opens_frames(self, opener: Any, raw: asyncio.Transport) -> bool:
        """Take the sealed channel's frames straight from ``raw`` (see
        :class:`~kubeserve.runtime.sealing.SealedProtocol`): the compiled ``opener`` opens them
        and parses a whole common answer in one call (anything else goes to httptools), and a
        request is sealed and written in one step."""
        opener.serve_answers(_UNSERVED, _MODELS)
        self.opener = opener
        self.raw = raw
        self.seal_parts = self.transport.sealer.seal_parts  # type: ignore[attr-defined]
        return True

    def request(
        self, head: bytes, body: bytes, waiter: Any = None
    ) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Write a call; the future of its ``(status, body, keep_alive)``, or ``waiter`` (a
        :class:`_PendingCall`, which the answer resolves with the call's result)."""
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        # One writelines, one syscall: head, length, blank line and body together.
        parts = (head, b"%d\r\n\r\n" % len(body), body)
        seal_parts = self.seal_parts
        if seal_parts is not None:
            self.raw.write(seal_parts(parts))  # type: ignore[union-attr]
        else:
            self.transport.writelines(parts)
        return waiter  # type: ignore[no-any-return]

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        opener = self.opener
        if opener is not None:  # sealed frames, straight from the raw transport
            try:
                if self.in_message:
                    data = opener.feed(data)
                else:
                    answer, data = opener.feed_answer(data)
                    if answer is not None:
                        status, body, keep_alive, self.unserved, self.models = answer
                        self._answered(status, body, keep_alive)
                        return
            except FrameError as exc:
                frame_failed(self.transport, exc)
                return
            if not data:
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"unparsable answer from the replica: {exc}"))
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"connection to the replica lost: {exc or 'closed'}"))

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if waiter.__class__ is _PendingCall:
                waiter.failed(exc)
            else:
                waiter.set_exception(exc)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.body = []
        self.unserved = ""
        self.models = None

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)
        if size == len(_UNSERVED) and name.lower() == _UNSERVED:
            self.unserved = value.decode("latin-1") or "unserved"
        elif size == len(_MODELS) and name.lower() == _MODELS:
            self.models = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self._answered(self.parser.get_status_code(), body, self.parser.should_keep_alive())

    def _answered(self, status: int, body: bytes, keep_alive: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():  # an answer nobody asked for: never reuse
            self.closed = True
            self.transport.close()
            return
        if waiter.__class__ is _PendingCall:
            waiter.answered(self, status, body, keep_alive)
        else:
            waiter.set_result((status, body, keep_alive))


class _PendingCall(asyncio.Future):  # type: ignore[type-arg]
    """The result of a call :meth:`HandleClient.start_call` wrote on a pooled connection, made
    by that connection as the answer arrives (:meth:`answered`, :meth:`failed`): what
    :meth:`_CallPool.call` and :meth:`HandleClient.call` do after the answer, done in the
    callback that parsed it. An answer saying the replica did not serve the call (it is full
    or leaving) hands the call to a task trying elsewhere (:meth:`HandleClient._send`), whose
    outcome becomes this one's.

    Cancelled (its caller's task was, or ``DeploymentResponse.cancel``), it closes the
    connection, as cancelling :meth:`HandleClient.call` does (the answer may still come, and
    the replica cancels the call when its connection goes), and gives the slot back."""

    #: (client, deployment key, method, payload, model id, replica, pool)
    call: tuple[HandleClient, str, str, bytes, str, RoutedReplica, _CallPool]
    #: the connection the call is written on, until its answer or loss
    conn: _CallConnection | None
    #: the task trying the call elsewhere, once the replica did not serve it
    retry: asyncio.Task[Any] | None

    def answered(self, conn: _CallConnection, status: int, body: bytes, keep_alive: bool) -> None:
        client, key, method, payload, model_id, replica, pool = self.call
        self.conn = None
        models, unserved = conn.models, conn.unserved
        if keep_alive and conn.usable():
            pool.put(conn)
        else:
            conn.close()
        router = client.router
        if status == 503 and unserved:  # not served there: elsewhere, or later
            first = (
                _AtCapacity()
                if unserved == UNSERVED_AT_CAPACITY
                else _Unreachable("the replica is shutting down and did not start the call")
            )
            retry = self.retry = self.get_loop().create_task(
                client._send(key, method, payload, model_id, replica, decode_result, first)
            )
            retry.add_done_callback(self._retried)
            return
        if models is not None:
            router.note_models(replica, models)
        router.release(replica)
        try:
            if status == 200:
                self.set_result(_loads(body))  # decode_result, written out
                return
            if status == 500:
                error = remote_error(decode_result(body), f"{key}.{method}")
            else:
                error = DeploymentUnavailableError(
                    f"replica {replica.replica_id} of {key} answered {status}: {body[:200]!r}"
                )
        except Exception as exc:  # an answer that does not unpickle here
            error = exc
        self.set_exception(error)

    def failed(self, exc: Exception) -> None:
        """The connection was lost (or sent nonsense) before the whole answer: the replica may
        have run the call, which is not sent again."""
        client, key, _, _, _, replica, _ = self.call
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()
        client.router.release(replica)
        error = ReplicaDiedError(
            f"replica {replica.replica_id} of {key} failed: {exc or type(exc).__name__}"
        )
        error.__cause__ = exc
        self.set_exception(error)

    def _retried(self, retry: asyncio.Task[Any]) -> None:
        if self.done():
            return
        if retry.cancelled():
            super().cancel()
        elif retry.exception() is not None:
            self.set_exception(retry.exception())  # type: ignore[arg-type]
        else:
            self.set_result(retry.result())

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        retry, self.retry = self.retry, None
        if retry is not None:
            retry.cancel()  # it gives the slot back
        else:
            conn, self.conn = self.conn, None
            if conn is not None:
                conn.close()
                self.call[0].router.release(self.call[5])
        return super().cancel(msg)


#: Items of a stream waiting for its caller before the connection stops reading the replica.
_STREAM_HIGH = 64


class _StreamConnection(KeepAliveConnection):
    """One streamed call: the answer's frames (:func:`~kubeserve.runtime.wire.encode_frame`) are
    decoded as they arrive and queued for :meth:`items`.

    Backpressure: beyond :data:`_STREAM_HIGH` queued frames reading pauses until the caller took
    half of them, so a caller that stops iterating stops the replica's generator (whose send
    timeout then ends the call and frees its slot there) instead of filling this process."""

    def __init__(self) -> None:
        super().__init__()
        self.parser = httptools.HttpResponseParser(self)
        self.frames = FrameReader()
        self.queue: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self.paused = False
        #: set while the transport's buffer is above its high-water mark (a duplex call's pump
        #: waits for it)
        self.sending: asyncio.Future[None] | None = None
        self.status = 0
        self.body: list[bytes] = []
        #: the answer's :data:`MODELS_HEADER` until the router was told, else None
        self.models: bytes | None = None
        #: the caller read the stream to its end (:data:`FRAME_END`)
        self.finished = False
        #: the answer is complete, and whether the replica keeps the connection open
        self.complete = self.keep_alive = False
        #: where the connection goes once its answer completes (see :meth:`recycle`)
        self.pool: IdlePool[_StreamConnection] | None = None

    def recycle(self, pool: IdlePool[_StreamConnection] | None) -> None:
        """The call is over: back to ``pool`` when the stream was read to its end and the
        replica keeps the connection (once the answer's last bytes arrived, which may come after
        the end frame), else closed."""
        if pool is None or not self.finished or self.closed:
            self.close()
        elif not self.complete:
            self.pool = pool  # on_message_complete recycles it
        elif self.keep_alive and self.usable() and not self.paused:
            self.finished = self.complete = False
            self.status = 0
            pool.put(self)
        else:
            self.close()

    def send(self, method: str, replica: RoutedReplica, body: bytes) -> None:
        head = (
            f"POST {STREAM_PREFIX}{method} HTTP/1.1\r\nHost: {replica.host}:{replica.port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        self.transport.writelines((head, body))

    def send_duplex(self, method: str, replica: RoutedReplica, call: bytes) -> None:
        """The head of a duplex call and its first frame (the call); :meth:`pump` the rest."""
        head = (
            f"POST {DUPLEX_PREFIX}{method} HTTP/1.1\r\nHost: {replica.host}:{replica.port}\r\n"
            "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode("latin-1")
        self.transport.writelines((head, *_chunk(encode_frame(FRAME_ITEM, call))))

    def pause_writing(self) -> None:
        self.sending = self.sending or asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        sending, self.sending = self.sending, None
        if sending is not None and not sending.done():
            sending.set_result(None)

    async def pump(self, inputs: AsyncIterator[Any]) -> None:
        """Each of ``inputs`` as a frame of the body, then the body's end. A failing ``inputs``
        (the client went away) closes the connection; the answer says the rest. While the
        replica does not take what was sent (its handler reads slowly, see ``Inflow``), the next
        item is not taken from ``inputs``: the client is slowed, not buffered here."""
        try:
            async for item in inputs:
                if self.closed:
                    return
                self.transport.writelines(_chunk(encode_frame(FRAME_ITEM, encode_result(item))))
                if self.sending is not None:
                    await self.sending
        except Exception:  # the client's stream broke: the replica's input ends cancelled
            self.close()
            return
        if not self.closed:
            self.transport.write(b"0\r\n\r\n")

    async def items(
        self, key: str, replica_id: str, decode: Callable[[bytes], Any]
    ) -> AsyncIterator[Any]:
        queue = self.queue
        while True:
            kind, payload = await queue.get()
            if self.paused and queue.qsize() <= _STREAM_HIGH // 2 and not self.closed:
                self.paused = False
                self.transport.resume_reading()
            if kind == FRAME_ITEM:
                yield decode(payload)
            elif kind == FRAME_END:
                self.finished = True
                return
            elif kind == FRAME_ERROR:
                raise remote_error(decode_result(payload), key)
            else:  # b"": the connection ended; payload says how
                raise ReplicaDiedError(
                    f"replica {replica_id} of {key}: {payload.decode(errors='replace')}"
                )

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.queue.put_nowait((b"", f"unparsable answer: {exc}".encode()))
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.resume_writing()  # a pump waiting to send sees the connection closed
        self.queue.put_nowait((b"", f"connection lost: {exc or 'closed'}".encode()))

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == len(_MODELS) and name.lower() == _MODELS:
            self.models = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status == 200:
            for frame in self.frames.feed(body):
                self.queue.put_nowait(frame)
            if not self.paused and self.queue.qsize() >= _STREAM_HIGH:
                self.paused = True
                self.transport.pause_reading()
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status == 200:
            self.complete, self.keep_alive = True, self.parser.should_keep_alive()
            pool, self.pool = self.pool, None
            if pool is not None:
                self.recycle(pool)
            return
        body = b"".join(self.body)
        if self.status == 500:
            self.queue.put_nowait((FRAME_ERROR, body))
        else:
            self.queue.put_nowait((b"", f"answered {self.status}: {body[:200]!r}".encode()))


def _chunk(data: bytes) -> tuple[bytes, bytes, bytes]:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n" % len(data), data, b"\r\n"


def remote_error(error: Any, what: str) -> BaseException:
    """What a handle call raises when the replica answered with an error: a callee's
    :class:`RayTaskError` as an instance of its cause's class too, as Ray raises it."""
    if isinstance(error, RayTaskError):
        return error.as_instanceof_cause()
    if isinstance(error, BaseException):
        return error
    return RuntimeError(f"{what} failed: {error!r}")


def _handle_span(app: str, deployment: str, method: str) -> tuple[dict[str, Any], str]:
    """The attributes and name of a handle call's span (Ray's ``route_to_replica``)."""
    current = context.request_context.get()
    attributes = {
        "request_id": current.request_id if current is not None else "",
        "app": app,
        "deployment": deployment,
        "call_method": method,
    }
    return attributes, f"route_to_replica {deployment} {method}"


def _call_options(model_id: str, extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a call carries besides its arguments: the multiplexed model, and the id of the
    request being served here, so the callee's log records name the request that caused them
    (and ``extra``)."""
    options: dict[str, Any] = dict(extra) if extra else {}
    if model_id:
        options["model_id"] = model_id
    current = context.request_context.get()
    if current is not None and current.request_id:
        options["request_id"] = current.request_id
    return options or None
