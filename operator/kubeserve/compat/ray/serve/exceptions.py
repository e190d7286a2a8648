"""Ray Serve's exception types (``ray.serve.exceptions``), raised where Ray raises them.

::

    RayServeException
     +-- BackPressureError        a deployment's queue is full (max_queued_requests)
     +-- DeploymentUnavailableError (also kubeserve's DeploymentUnavailableError)
     +-- ReplicaUnavailableError
     +-- RequestCancelledError    (also asyncio.CancelledError's sibling: a cancelled request)
     +-- gRPCStatusError
"""

from __future__ import annotations

from typing import Any

from kubeserve.compat.ray import not_provided
from kubeserve.sdk.errors import DeploymentUnavailableError as _KubeserveUnavailable
from kubeserve.sdk.errors import RayServeException, RequestCancelledError
from kubeserve.sdk.grpc_context import GrpcStatusError

__all__ = [
    "BackPressureError",
    "DeploymentUnavailableError",
    "RayServeException",
    "ReplicaUnavailableError",
    "RequestCancelledError",
    "gRPCStatusError",
]


class BackPressureError(RayServeException):
    """Too many requests are queued for a deployment (``max_queued_requests``)."""

    def __init__(self, *, num_queued_requests: int = 0, max_queued_requests: int = 0) -> None:
        super().__init__(num_queued_requests, max_queued_requests)
        self._message = (
            f"Request dropped due to backpressure (num_queued_requests={num_queued_requests}, "
            f"max_queued_requests={max_queued_requests})."
        )

    @property
    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


class DeploymentUnavailableError(RayServeException, _KubeserveUnavailable):
    """The deployment cannot take the request (no replica running, or all full)."""

    def __init__(self, deployment_id: Any = None) -> None:
        super().__init__(deployment_id)
        self._deployment_id = deployment_id

    @property
    def message(self) -> str:
        return f"{self._deployment_id} is unavailable because it failed to deploy."


class ReplicaUnavailableError(RayServeException):
    """The replica handling a request became unreachable."""


class gRPCStatusError(RayServeException, GrpcStatusError):
    """A method served over gRPC raised after setting a status code on its ``grpc_context``:
    the proxy answers with that code (Ray's internal wrapper, public in its names)."""


__getattr__ = not_provided.module_getattr(__name__)
