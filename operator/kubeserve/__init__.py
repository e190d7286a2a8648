"""kubeserve: serve Python applications declaratively, on one machine or on Kubernetes.

User code imports the SDK from here::

    from kubeserve import deployment, DeploymentHandle, Request

    @deployment(num_replicas=2)
    class Hello:
        async def __call__(self, request: Request) -> str:
            return "hello"

    app = Hello.bind()

The SDK's names load at their first use (PEP 562): the proxy and the replicas import
``kubeserve.runtime`` modules, and load only the part of the SDK their application uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeserve.sdk.application import Application, GraphError, GraphNode
    from kubeserve.sdk.deployment import Deployment, DeploymentOptions, deployment
    from kubeserve.sdk.errors import BackPressureError, DeploymentUnavailableError, KubeserveError
    from kubeserve.sdk.handle import DeploymentHandle, DeploymentResponse
    from kubeserve.sdk.http import (
        URL,
        Headers,
        HTMLResponse,
        JSONResponse,
        PlainTextResponse,
        QueryParams,
        Request,
        Response,
        StreamingResponse,
    )

__version__ = "0.1.0"

__all__ = [
    "URL",
    "Application",
    "BackPressureError",
    "Deployment",
    "DeploymentHandle",
    "DeploymentOptions",
    "DeploymentResponse",
    "DeploymentUnavailableError",
    "GraphError",
    "GraphNode",
    "HTMLResponse",
    "Headers",
    "JSONResponse",
    "KubeserveError",
    "PlainTextResponse",
    "QueryParams",
    "Request",
    "Response",
    "StreamingResponse",
    "__version__",
    "deployment",
]

#: The module of the SDK that defines each exported name.
_SDK_MODULES = {
    name: module
    for module, names in (
        ("application", "Application GraphError GraphNode"),
        ("deployment", "Deployment DeploymentOptions deployment"),
        ("errors", "BackPressureError DeploymentUnavailableError KubeserveError"),
        ("handle", "DeploymentHandle DeploymentResponse"),
        ("http", "URL Headers HTMLResponse JSONResponse PlainTextResponse QueryParams Request "
         "Response StreamingResponse"),
    )
    for name in names.split()
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _SDK_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'kubeserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kubeserve.sdk.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
