"""Errors user code can see from the SDK."""


class KubeserveError(Exception):
    """Base of every error kubeserve raises into user code."""


class DeploymentUnavailableError(KubeserveError):
    """A handle call found no replica to run it (none running, or all full until the timeout)."""


class BackPressureError(DeploymentUnavailableError):
    """A handle call refused at once: ``max_queued_requests`` calls already wait at this caller
    (Ray's ``BackPressureError``)."""


class UnsupportedOptionError(KubeserveError, ValueError):
    """A valid Ray Serve option kubeserve cannot honour; the message names it and says why."""
