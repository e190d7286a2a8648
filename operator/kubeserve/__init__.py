"""kubeserve: serve Python applications declaratively, on one machine or on Kubernetes.

User code imports the SDK from here::

    from kubeserve import deployment, DeploymentHandle, Request

    @deployment(num_replicas=2)
    class Hello:
        async def __call__(self, request: Request) -> str:
            return "hello"

    app = Hello.bind()
"""

from kubeserve.sdk import (
    URL,
    Application,
    BackPressureError,
    Deployment,
    DeploymentHandle,
    DeploymentOptions,
    DeploymentResponse,
    DeploymentUnavailableError,
    GraphError,
    GraphNode,
    Headers,
    HTMLResponse,
    JSONResponse,
    KubeserveError,
    PlainTextResponse,
    QueryParams,
    Request,
    Response,
    StreamingResponse,
    deployment,
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
