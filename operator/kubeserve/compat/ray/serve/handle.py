"""``ray.serve.handle``: the handle types Serve applications annotate and call."""

from __future__ import annotations

from kubeserve.compat.ray import not_provided
from kubeserve.sdk.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator"]


__getattr__ = not_provided.module_getattr(__name__)
