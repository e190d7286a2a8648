"""Test application that writes to its log on every request (``kubeserve logs`` reads it)."""

import logging

from kubeserve import Request, deployment

log = logging.getLogger("talker")


@deployment
class Talker:
    async def __call__(self, request: Request) -> str:
        word = request.query_params.get("word", "")
        print(f"heard {word}", flush=True)
        return word


app = Talker.bind()
