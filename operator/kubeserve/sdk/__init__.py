"""What users import to write an application: ``@deployment``, ``.bind()``, handles, HTTP types.

Re-exported from :mod:`kubeserve`; user code should write ``from kubeserve import deployment``.
"""

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
    "deployment",
]
