"""``ray.serve.handle``: the handle types Serve applications annotate and call."""

from __future__ import annotations

from kubeserve.sdk.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator"]
