"""``ray.serve.deployment``: the application and deployment types."""

from __future__ import annotations

from kubeserve.sdk.application import Application
from kubeserve.sdk.deployment import Deployment

__all__ = ["Application", "Deployment"]
