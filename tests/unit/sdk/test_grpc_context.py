"""The gRPC context's trip to the replica and back: what a method sets comes back, an untouched
context does not (the proxy applies its own copy), and the input stream of client streams."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from typing import Any

from kubeserve.runtime.replica.grpc_call import grpc_answer
from kubeserve.runtime.wire import decode_grpc_answer
from kubeserve.sdk.grpc_context import RayServegRPCContext, gRPCInputStream


class _ServerContext:
    """What grpcio's server-side context answers for an insecure call."""

    def auth_context(self) -> dict[str, Any]:
        return {}

    def code(self) -> Any:
        return None

    def details(self) -> Any:
        return None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("application", "app1"), ("request_id", "r-1"))

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def peer_identities(self) -> Any:
        return None

    def peer_identity_key(self) -> Any:
        return None

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def arrived() -> RayServegRPCContext:
    """A context as the replica gets it."""
    ctx = RayServegRPCContext(_ServerContext())
    ctx.set_trailing_metadata([("request_id", "r-1")])
    received: RayServegRPCContext = pickle.loads(pickle.dumps(ctx))
    return received


def test_the_context_crosses_with_what_the_proxy_read() -> None:
    ctx = arrived()
    assert (ctx.application(), ctx.request_id(), ctx.peer()) == (
        "app1",
        "r-1",
        "ipv4:127.0.0.1:5000",
    )
    assert ctx.trailing_metadata() == [("request_id", "r-1")]
    assert ctx.auth_context() == {} and ctx.code() is None


def test_the_proxys_shortcut_builds_the_same_context() -> None:
    server = _ServerContext()
    security = (server.auth_context(), server.peer_identities(), server.peer_identity_key())
    metadata = list(server.invocation_metadata())
    quick = RayServegRPCContext._of_new_call(metadata, "r-1", server.peer(), security)
    assert pickle.dumps(quick) == pickle.dumps(arrived())


def test_an_untouched_context_is_not_sent_back() -> None:
    answer = grpc_answer(arrived(), b"answer")
    assert answer == b"Manswer"  # the message as serialized, sent on as is
    assert decode_grpc_answer(answer) == (None, b"answer")


def test_what_a_method_set_is_sent_back() -> None:
    for change in (
        lambda c: c.set_code("INVALID_ARGUMENT"),
        lambda c: c.set_details("why"),
        lambda c: c.set_trailing_metadata([("num", "1")]),
        lambda c: c.trailing_metadata().append(("num", "1")),  # in place, too
    ):
        ctx = arrived()
        change(ctx)
        back, message = decode_grpc_answer(grpc_answer(ctx, b"m"))
        assert message == b"m"
        assert back.trailing_metadata() == ctx.trailing_metadata()
        assert back.trailing_metadata()[0] == ("request_id", "r-1")


def test_input_stream_ends_and_tells_a_cancel() -> None:
    async def messages() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    async def main() -> None:
        stream: gRPCInputStream[int] = gRPCInputStream(messages())
        assert [m async for m in stream] == [0, 1, 2]
        assert stream.is_exhausted and not stream.is_cancelled()
        cancelled: gRPCInputStream[int] = gRPCInputStream(messages())
        cancelled.cancel()
        assert [m async for m in cancelled] == [] and cancelled.is_cancelled()

    asyncio.run(main())
