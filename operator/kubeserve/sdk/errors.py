"""Errors user code can see from the SDK."""

from kubeserve.sdk.ray_errors import ActorDiedError


class KubeserveError(Exception):
    """Base of every error kubeserve raises into user code."""


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
