"""A plain ingress that reports which of the replica's optional machinery its process loaded:
Starlette (for the request object) and the handle client (for calls to other deployments)."""

import sys

from kubeserve import deployment

OPTIONAL = ("starlette", "kubeserve.runtime.handle_client")


@deployment
class Light:
    async def __call__(self, request):  # type: ignore[no-untyped-def]
        if request.path == "/cookies":  # beyond kubeserve's Request: Starlette's surface
            return {"cookies": dict(request.cookies), "scope": request.scope["type"]}
        if request.path == "/headers":
            return {"token": request.headers.get("x-token"), "path": request.url.path}
        return {"loaded": [name for name in OPTIONAL if name in sys.modules]}


app = Light.bind()
