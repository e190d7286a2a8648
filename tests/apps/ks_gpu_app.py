"""Test application reporting the GPUs its replica was given (``CUDA_VISIBLE_DEVICES``)."""

import os

from kubeserve import Request, deployment


@deployment
class Gpus:
    async def __call__(self, request: Request) -> dict[str, object]:
        return {"pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


app = Gpus.bind()
