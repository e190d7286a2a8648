"""What a deployment served over gRPC sees: the call's context, and the status it can set.

The gRPC proxy (:mod:`kubeserve.runtime.proxy.grpc_ingress`) builds a :class:`RayServegRPCContext`
from the client's call, sends it to the ingress replica with the request message, and the replica
hands it to a method that takes a ``grpc_context`` argument (Ray 2.60's convention). What the
method sets on it (status code, details, trailing metadata) travels back with the answer and is
set on the client's call by the proxy. A client-streaming or bidirectional method is given the
client's messages as a :class:`gRPCInputStream` (its one positional argument), as in Ray.

Nothing here imports ``grpc``: a status code is whatever ``grpc.StatusCode`` member the user
code set, pickled by name, so a replica that never serves gRPC never loads grpcio.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

__all__ = ["GRPC_CONTEXT_ARG", "GrpcStatusError", "RayServegRPCContext", "gRPCInputStream"]

T = TypeVar("T")

#: The parameter name through which a deployment method receives the context.
GRPC_CONTEXT_ARG = "grpc_context"


class RayServegRPCContext:
    """The gRPC context of one call, as Ray's ``ray.serve.grpc_util.RayServegRPCContext``.

    Built by the proxy from the server-side ``grpc.aio.ServicerContext`` (a copy: it pickles),
    read and written by the deployment. Invariant: the proxy's ``request_id`` trailer stays
    first in :meth:`trailing_metadata` whatever the user sets (Ray's behaviour).
    """

    #: the trailing metadata it arrived with (on the replica): see :meth:`_changed`
    _arrived: list[tuple[str, Any]] | None = None

    def __init__(self, grpc_context: Any) -> None:
        self._auth_context = dict(grpc_context.auth_context())
        self._code = grpc_context.code()
        self._details = grpc_context.details()
        self._invocation_metadata = [(m[0], m[1]) for m in grpc_context.invocation_metadata()]
        self._invocation_metadata_dict = dict(self._invocation_metadata)
        self._peer = grpc_context.peer()
        self._peer_identities = grpc_context.peer_identities()
        self._peer_identity_key = grpc_context.peer_identity_key()
        self._trailing_metadata = [(k, v) for k, v in grpc_context.trailing_metadata()]
        self._compression: Any = None

    @classmethod
    def _of_new_call(
        cls,
        metadata: list[tuple[str, Any]],
        request_id: str,
        peer: Any,
        security: tuple[dict[str, Any], Any, Any],
    ) -> RayServegRPCContext:
        """The context of a call that has just arrived at the proxy, from what the proxy read of
        it already (``metadata``: its invocation metadata as pairs; ``security``: its auth
        context, peer identities and identity key), with the ``request_id`` trailer: the same as
        ``RayServegRPCContext(grpc_context)`` then ``set_trailing_metadata`` of the id, without
        asking grpc again (nothing set a status, details or trailers on a new call yet)."""
        ctx = cls.__new__(cls)
        ctx._auth_context, ctx._peer_identities, ctx._peer_identity_key = security
        ctx._code = None
        ctx._details = None
        ctx._invocation_metadata = metadata
        ctx._invocation_metadata_dict = dict(metadata)
        ctx._peer = peer
        ctx._trailing_metadata = [("request_id", request_id)]
        ctx._compression = None
        return ctx

    def auth_context(self) -> dict[str, Any]:
        return self._auth_context

    def code(self) -> Any:
        """The status code set so far (a ``grpc.StatusCode``), or None."""
        return self._code

    def details(self) -> str:
        return str(self._details or "")

    def request_id(self) -> str | None:
        return self._invocation_metadata_dict.get("request_id")

    def application(self) -> str | None:
        return self._invocation_metadata_dict.get("application")

    def multiplexed_model_id(self) -> str | None:
        return self._invocation_metadata_dict.get("multiplexed_model_id")

    def traceparent(self) -> str | None:
        return self._invocation_metadata_dict.get("traceparent")

    def tracestate(self) -> str | None:
        return self._invocation_metadata_dict.get("tracestate")

    def invocation_metadata(self) -> list[tuple[str, Any]]:
        return self._invocation_metadata

    def peer(self) -> str:
        return str(self._peer)

    def peer_identities(self) -> Any:
        return self._peer_identities

    def peer_identity_key(self) -> str | None:
        key = self._peer_identity_key
        return None if key is None else str(key)

    def trailing_metadata(self) -> list[tuple[str, Any]]:
        return self._trailing_metadata

    def set_code(self, code: Any) -> None:
        self._code = code

    def set_compression(self, compression: Any) -> None:
        self._compression = compression

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, trailing_metadata: list[tuple[str, Any]]) -> None:
        """Replace the trailing metadata; the request id the proxy set is kept."""
        kept = [(k, v) for k, v in self._trailing_metadata if k == "request_id"][:1]
        self._trailing_metadata = kept + list(trailing_metadata)

    def __reduce__(self) -> tuple[Any, ...]:
        # A flat tuple, not the instance dict: it crosses to the replica with every gRPC call.
        return (
            _rebuilt,
            (
                self._auth_context or None,
                self._code,
                self._details,
                self._invocation_metadata,
                self._peer,
                self._peer_identities,
                self._peer_identity_key,
                self._trailing_metadata,
                self._compression,
            ),
        )

    def _changed(self) -> bool:
        """Whether the method set anything since the context arrived: when not, the replica
        does not send it back (the proxy holds the same)."""
        return bool(
            self._code
            or self._details
            or self._compression
            or self._trailing_metadata != self._arrived
        )

    def _set_on_grpc_context(self, grpc_context: Any) -> None:
        """Copy what was set here onto the server-side context of the client's call."""
        if self._code:
            grpc_context.set_code(self._code)
        if self._compression:
            grpc_context.set_compression(self._compression)
        if self._details:
            grpc_context.set_details(self._details)
        if self._trailing_metadata:
            grpc_context.set_trailing_metadata(tuple(self._trailing_metadata))


def _rebuilt(
    auth_context: dict[str, Any] | None,
    code: Any,
    details: Any,
    invocation_metadata: list[tuple[str, Any]],
    peer: Any,
    peer_identities: Any,
    peer_identity_key: Any,
    trailing_metadata: list[tuple[str, Any]],
    compression: Any,
) -> RayServegRPCContext:
    """A context unpickled (on the replica), remembering the trailers it arrived with."""
    ctx = RayServegRPCContext.__new__(RayServegRPCContext)
    ctx._auth_context = auth_context or {}
    ctx._code = code
    ctx._details = details
    ctx._invocation_metadata = invocation_metadata
    ctx._invocation_metadata_dict = dict(invocation_metadata)
    ctx._peer = peer
    ctx._peer_identities = peer_identities
    ctx._peer_identity_key = peer_identity_key
    ctx._trailing_metadata = trailing_metadata
    ctx._arrived = list(trailing_metadata)
    ctx._compression = compression
    return ctx


class GrpcStatusError(Exception):
    """A method served over gRPC raised after setting a status code on its context: the proxy
    answers with that code (and the details set, else the exception's text), not INTERNAL."""

    def __init__(
        self, original_exception: BaseException, code: Any = None, details: str | None = None
    ) -> None:
        super().__init__(str(original_exception))
        self._original_exception = original_exception
        self._grpc_code = code
        self._grpc_details = details

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._original_exception, self._grpc_code, self._grpc_details))

    @property
    def original_exception(self) -> BaseException:
        return self._original_exception

    @property
    def grpc_code(self) -> Any:
        return self._grpc_code

    @property
    def grpc_details(self) -> str | None:
        return self._grpc_details


class gRPCInputStream(AsyncIterator[T], Generic[T]):
    """The messages of a client-streaming or bidirectional call, as Ray's
    ``ray.serve.grpc_util.gRPCInputStream``: iterate it with ``async for``.

    Iteration ends when the client closed its side of the call, or when the call was cancelled
    (the client went away): :meth:`is_cancelled` tells them apart.
    """

    def __init__(
        self, request_iterator: AsyncIterator[T], *, cancel_event: asyncio.Event | None = None
    ) -> None:
        self._request_iterator = request_iterator
        self._cancel_event = cancel_event or asyncio.Event()
        self._exhausted = False

    def __aiter__(self) -> gRPCInputStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._exhausted:
            raise StopAsyncIteration
        try:
            if self._cancel_event.is_set():
                raise StopAsyncIteration
            return await self._request_iterator.__anext__()
        except StopAsyncIteration:
            self._exhausted = True
            raise

    def is_cancelled(self) -> bool:
        return self._cancel_event.is_set()

    def cancel(self) -> None:
        """Stop the iteration (the messages still unread are dropped)."""
        self._cancel_event.set()

    @property
    def is_exhausted(self) -> bool:
        return self._exhausted
