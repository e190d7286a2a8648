"""Errors user code can see from the SDK."""

from kubeserve.sdk.ray_errors import ActorDiedError, TaskCancelledError


class KubeserveError(Exception):
    """Base of every error kubeserve raises into user code."""


class RayServeException(KubeserveError):
    """Base of Ray Serve's errors (``ray.serve.exceptions.RayServeException``)."""


class RequestCancelledError(RayServeException, TaskCancelledError):
    """A handle call its caller cancelled (``response.cancel()``), raised by ``.result()`` and
    ``await`` as Ray 2.60 raises it, in either mode (``ray.serve.exceptions``)."""

    def __init__(self, request_id: str | None = None) -> None:
        super().__init__(request_id)
        self._request_id = request_id

    def __str__(self) -> str:
        if self._request_id:
            return f"Request {self._request_id} was cancelled."
        return "Request was cancelled."


class DeploymentUnavailableError(KubeserveError):
    """A handle call found no replica to run it (none running, or all full until the timeout)."""


class ReplicaDiedError(DeploymentUnavailableError, ActorDiedError):
    """The replica running a call was lost after the call was sent (its process died, or its
    connection did): the call may have run. Ray raises ``ActorDiedError`` for the same."""


class BackPressureError(DeploymentUnavailableError):
    """A handle call refused at once: ``max_queued_requests`` calls already wait at this caller
    (Ray's ``BackPressureError``)."""


class UnsupportedOptionError(KubeserveError, ValueError):
    """A valid Ray Serve option kubeserve cannot honour; the message names it and says why."""
