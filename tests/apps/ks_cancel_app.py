"""Test application for request cancellation, written as a Ray Serve user writes one: each
handler notes under a tag when it started and how it ended, so a test that disconnects from the
proxy can ask (``?state=TAG``) whether the replica cancelled it.

``?hold=TAG``: ``Front`` awaits ``Back.hold`` (which sleeps a minute); ``?stream=TAG``: a body
streamed a chunk at a time, forever; ``?sleep=S``: "slept" after S seconds; ``/asgi/hold/TAG``
(the ``asgi`` app): a FastAPI endpoint that sleeps a minute; ``?state=TAG`` /
``/asgi/state/TAG``: what each noted, as JSON."""

import asyncio

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import StreamingResponse

#: what each handler of this process noted, by tag: "running", "cancelled", "finally", "done"
NOTES: dict[str, list[str]] = {}


def note(tag: str, what: str) -> None:
    NOTES.setdefault(tag, []).append(what)


async def held(tag: str, seconds: float) -> str:
    """Sleep ``seconds`` noting under ``tag`` that it runs, and how it ended."""
    note(tag, "running")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note(tag, "cancelled")
        raise
    finally:
        note(tag, "finally")
    note(tag, "done")
    return "held"


@serve.deployment
class Back:
    async def hold(self, tag: str) -> str:
        return await held(tag, 60)

    def state(self, tag: str) -> list[str]:
        return NOTES.get(tag, [])


@serve.deployment
class Front:
    def __init__(self, back: DeploymentHandle) -> None:
        self.back = back

    async def __call__(self, request: Request):
        query = request.query_params
        if "state" in query:
            tag = query["state"]
            return {"front": NOTES.get(tag, []), "back": await self.back.state.remote(tag)}
        if "hold" in query:
            tag = query["hold"]
            note(tag, "running")
            try:
                return await self.back.hold.remote(tag)
            except asyncio.CancelledError:
                note(tag, "cancelled")
                raise
            finally:
                note(tag, "finally")
        if "sleep" in query:
            await asyncio.sleep(float(query["sleep"]))
            return "slept"
        if "stream" in query:
            return StreamingResponse(ticks(query["stream"]), media_type="text/plain")
        return "ok"


async def ticks(tag: str):
    note(tag, "running")
    try:
        while True:
            yield b"tick\n"
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        note(tag, "cancelled")
        raise
    finally:
        note(tag, "finally")


api = FastAPI()


@serve.deployment
@serve.ingress(api)
class Asgi:
    @api.get("/hold/{tag}")
    async def hold(self, tag: str) -> str:
        return await held(tag, 60)

    @api.get("/state/{tag}")
    def state(self, tag: str) -> dict[str, list[str]]:
        return {"front": NOTES.get(tag, [])}


app = Front.bind(Back.bind())
asgi = Asgi.bind()
