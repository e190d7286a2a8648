"""A handle call the gRPC proxy makes on behalf of a gRPC client (Ray 2.60's conventions).

The call carries the client's :class:`~kubeserve.sdk.grpc_context.RayServegRPCContext` in its
options (``"grpc"``). The method gets it as its ``grpc_context`` argument when it declares one;
its answer (each item, for a streaming method) goes back as the message serialized here, which the
proxy sends as is, with the context only when the method changed it (else the proxy holds the
same; :func:`~kubeserve.runtime.wire.encode_grpc_answer`); a method that set a status code and
then raised fails with :class:`~kubeserve.sdk.grpc_context.GrpcStatusError`, which the proxy
answers with that code. A client-streaming or bidirectional method gets the client's messages as
a :class:`~kubeserve.sdk.grpc_context.gRPCInputStream`, its first positional argument, fed by the
duplex call's body (:mod:`~kubeserve.runtime.replica.inflow`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubeserve.runtime.replica.inflow import LOST, Inflow
from kubeserve.runtime.wire import FRAME_ITEM, decode_result, encode_grpc_answer
from kubeserve.sdk.grpc_context import (
    GRPC_CONTEXT_ARG,
    GrpcStatusError,
    RayServegRPCContext,
    gRPCInputStream,
)

__all__ = ["grpc_answer", "grpc_arguments", "grpc_error", "input_stream"]

#: method -> whether it takes ``grpc_context`` (methods live as long as the replica)
_TAKES_CONTEXT: dict[Any, bool] = {}


def grpc_arguments(
    method: Callable[..., Any], kwargs: dict[str, Any], ctx: RayServegRPCContext
) -> dict[str, Any]:
    """``kwargs``, with the context added when ``method`` takes it."""
    key = getattr(method, "__func__", method)
    takes = _TAKES_CONTEXT.get(key)
    if takes is None:
        try:
            takes = GRPC_CONTEXT_ARG in inspect.signature(method).parameters
        except (TypeError, ValueError):
            takes = False
        _TAKES_CONTEXT[key] = takes
    return {**kwargs, GRPC_CONTEXT_ARG: ctx} if takes else kwargs


def grpc_answer(ctx: RayServegRPCContext, message: Any) -> bytes:
    """What the proxy receives for one response message (:func:`encode_grpc_answer`): the
    context only when the method changed it (else the proxy applies its own copy)."""
    changed = ctx if ctx._changed() else None
    if isinstance(message, bytes | bytearray):
        return encode_grpc_answer(changed, bytes(message))
    serialize = getattr(message, "SerializeToString", None)
    if serialize is None:
        raise TypeError(
            f"a method served over gRPC must return a protobuf message, not "
            f"{type(message).__name__}"
        )
    return encode_grpc_answer(changed, serialize())


def grpc_error(ctx: RayServegRPCContext, exc: Exception) -> Exception:
    """``exc``, wrapped with the status code the method set before raising it (if any)."""
    if not ctx.code():
        return exc
    wrapped = GrpcStatusError(exc, ctx.code(), ctx.details())
    wrapped.__cause__ = exc
    return wrapped


def input_stream(inflow: Inflow) -> gRPCInputStream[Any]:
    """The client's messages of a duplex call; cancelled when the caller went away (Ray's
    ``is_cancelled()``), ended when the client closed its side."""
    cancelled = asyncio.Event()

    async def messages() -> AsyncIterator[Any]:
        while True:
            kind, payload = await inflow.next()
            if kind == FRAME_ITEM:
                yield decode_result(payload)
                continue
            if kind == LOST:
                cancelled.set()
            return

    return gRPCInputStream(messages(), cancel_event=cancelled)
