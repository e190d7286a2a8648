"""The ``ksgrpc.Checks`` service (``protos/ks_grpc_checks.proto``) as a deployment: each method
exercises one corner of the gRPC proxy (errors, status set by the method, metadata, streams)."""

import asyncio
import os
import time

import grpc
from ks_grpc_checks_pb2 import Answer
from ray import serve
from ray.serve.grpc_util import gRPCInputStream

#: Hold calls by tag: when each began, and how long after that it was cancelled (None: not yet)
HOLDING: dict[str, list] = {}


@serve.deployment
class Checks:
    def Echo(self, ask, grpc_context):
        seen = dict(grpc_context.invocation_metadata())
        text = f"{ask.text}|app={grpc_context.application()}|rid={seen.get('request_id', '')}"
        return Answer(text=text, replica=str(os.getpid()))

    def Raise(self, ask):
        raise ValueError(f"no good: {ask.text}")

    def RaiseWithCode(self, ask, grpc_context):
        grpc_context.set_code(grpc.StatusCode.PERMISSION_DENIED)
        grpc_context.set_details(f"not for {ask.text}")
        raise RuntimeError("refused")

    def SetStatus(self, ask, grpc_context):
        grpc_context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        grpc_context.set_details("precondition")
        grpc_context.set_trailing_metadata([("why", ask.text)])
        return Answer(text="ignored by the client")

    async def Count(self, ask):
        for i in range(ask.count):
            yield Answer(text=ask.text, index=i)

    async def CountThenRaise(self, ask):
        for i in range(ask.count):
            yield Answer(text=ask.text, index=i)
        raise KeyError("stream broke")

    async def CountWithStatus(self, ask, grpc_context):
        for i in range(ask.count):
            if i == 1:
                grpc_context.set_trailing_metadata([("seen", str(i))])
            if i == ask.count - 1:
                grpc_context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
                grpc_context.set_details(f"stopped at {i} ✓")
            yield Answer(text=ask.text, index=i)

    async def Ticks(self, ask):  # as Count, letting the replica's loop run between items
        pause = 0.001 if ask.text == "paced" else 0  # "paced": about a thousand items a second
        for i in range(ask.count):
            await asyncio.sleep(pause)
            yield Answer(text=ask.text, index=i)

    async def Slow(self, ask):
        await asyncio.sleep(float(ask.text))
        return Answer(text="slept")

    async def Hold(self, ask):  # sleeps ask.count s; notes its cancellation under ask.text
        began = time.monotonic()
        HOLDING[ask.text] = [began, None]
        try:
            await asyncio.sleep(ask.count)
        except asyncio.CancelledError:
            HOLDING[ask.text][1] = time.monotonic() - began
            raise
        return Answer(text="held")

    def Held(self, ask):  # "unknown", "running", or "cancelled after <s>" of a Hold call
        if ask.text not in HOLDING:
            return Answer(text="unknown")
        after = HOLDING[ask.text][1]
        return Answer(text="running" if after is None else f"cancelled after {after:.3f}")

    async def Upload(self, asks: gRPCInputStream, grpc_context):
        texts, count = [], 0
        async for ask in asks:
            if ask.text == "hold":  # a handler that reads slowly: its caller must be slowed
                await asyncio.sleep(ask.count)
                continue
            count += 1
            if len(ask.text) <= 64:  # long ones are counted, not echoed
                texts.append(ask.text)
        grpc_context.set_trailing_metadata([("exhausted", str(asks.is_exhausted))])
        return Answer(text="+".join(texts), index=count)

    async def Chat(self, asks: gRPCInputStream):
        async for ask in asks:
            yield Answer(text=f"re:{ask.text}", index=ask.count)

    async def UploadThenRaise(self, asks: gRPCInputStream, grpc_context):
        async for ask in asks:
            if ask.text == "stop":
                grpc_context.set_code(grpc.StatusCode.ABORTED)
                raise ValueError(f"stopped after {ask.count}")
        return Answer(text="never stopped")

    def Unserved(self, asks):  # not a generator: a bidirectional method must yield
        return Answer(text="one")


app = Checks.bind()


@serve.deployment
class Other:
    async def Echo(self, ask):
        return Answer(text=f"other:{ask.text}")

    async def Count(self, ask):
        for i in range(ask.count):
            yield Answer(text=ask.text, index=i)


other = Other.bind()
