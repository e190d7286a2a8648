"""Ray core's public exceptions (``ray.exceptions``), for the errors a Serve caller catches.

They live here, below the runtime, so that where kubeserve meets the condition Ray names the
error it raises is an instance of Ray's class (a replica that died during a call raises a
:class:`ActorDiedError`); :mod:`kubeserve.compat.ray.exceptions` is ``ray.exceptions`` itself.
Most of them name conditions of Ray's own machinery (object store, raylets, placement groups)
that kubeserve never raises: they exist so that ``except ray.exceptions.X`` clauses import.

::

    RayError
     +-- RayTaskError              the callee raised (also an instance of the callee's error)
     +-- RayActorError
     |    +-- ActorDiedError       the replica died while running the call
     |    +-- ActorUnavailableError
     +-- TaskCancelledError
     +-- GetTimeoutError           (also TimeoutError)
     +-- RaySystemError
     |    +-- StreamingGeneratorReplayInconsistentError, RayChannelError
     |    |    +-- RayChannelTimeoutError (also TimeoutError)
     |    +-- RayCgraphCapacityExceeded, RayDirectTransportError
     +-- ObjectLostError
     |    +-- ObjectFetchTimedOutError, OwnerDiedError, ObjectReconstructionFailedError
     +-- the rest, each directly: CrossLanguageError, LocalRayletDiedError, WorkerCrashedError,
         AuthenticationError, ObjectStoreFullError, OutOfDiskError, OutOfMemoryError,
         NodeDiedError, PlasmaObjectNotAvailable, AsyncioActorExit, RuntimeEnvSetupError,
         TaskPlacementGroupRemoved, ActorPlacementGroupRemoved, PendingCallsLimitExceeded,
         TaskUnschedulableError, ActorUnschedulableError, UnserializableException
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorDiedError",
    "ActorPlacementGroupRemoved",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "AsyncioActorExit",
    "AuthenticationError",
    "CrossLanguageError",
    "GetTimeoutError",
    "LocalRayletDiedError",
    "NodeDiedError",
    "ObjectFetchTimedOutError",
    "ObjectLostError",
    "ObjectReconstructionFailedError",
    "ObjectStoreFullError",
    "OutOfDiskError",
    "OutOfMemoryError",
    "OwnerDiedError",
    "PendingCallsLimitExceeded",
    "PlasmaObjectNotAvailable",
    "RayActorError",
    "RayCgraphCapacityExceeded",
    "RayChannelError",
    "RayChannelTimeoutError",
    "RayDirectTransportError",
    "RayError",
    "RaySystemError",
    "RayTaskError",
    "RuntimeEnvSetupError",
    "StreamingGeneratorReplayInconsistentError",
    "TaskCancelledError",
    "TaskPlacementGroupRemoved",
    "TaskUnschedulableError",
    "UnserializableException",
    "WorkerCrashedError",
]


class RayError(Exception):
    """Base of Ray's exceptions."""


class RayTaskError(RayError):
    """A task (here: a handle call) raised; ``cause`` is the callee's exception."""

    def __init__(self, function_name: str = "", traceback_str: str = "", cause: Any = None) -> None:
        super().__init__(function_name, traceback_str, cause)
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause


class RayActorError(RayError):
    """The actor (here: the replica) running a call died or cannot be reached."""

    def __init__(self, *args: Any, error_msg: str = "The actor died unexpectedly.") -> None:
        super().__init__(*(args or (error_msg,)))
        self.error_msg = str(args[0]) if args else error_msg


class ActorDiedError(RayActorError):
    """The replica died while it ran the call (the call may or may not have taken effect)."""


class ActorUnavailableError(RayActorError):
    """The replica is unreachable for now (it may come back)."""


class TaskCancelledError(RayError):
    """The call was cancelled."""


class GetTimeoutError(RayError, TimeoutError):
    """Waiting for a result timed out."""


class RaySystemError(RayError):
    """Ray's system failed (not user code)."""


class StreamingGeneratorReplayInconsistentError(RaySystemError):
    """A retried streaming generator yielded differently."""


class RayChannelError(RaySystemError):
    """A compiled graph's channel failed."""


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    """A compiled graph's channel timed out."""


class RayCgraphCapacityExceeded(RaySystemError):
    """A compiled graph has too many calls in flight."""


class RayDirectTransportError(RaySystemError):
    """A direct transport of tensors failed."""


class ObjectLostError(RayError):
    """An object of Ray's object store was lost."""


class ObjectFetchTimedOutError(ObjectLostError):
    """Fetching an object from another node timed out."""


class OwnerDiedError(ObjectLostError):
    """The owner of an object died."""


class ObjectReconstructionFailedError(ObjectLostError):
    """A lost object could not be reconstructed."""


class CrossLanguageError(RayError):
    """A call across languages failed."""


class LocalRayletDiedError(RayError):
    """The node's raylet died."""


class WorkerCrashedError(RayError):
    """The worker process died unexpectedly."""


class AuthenticationError(RayError):
    """Authentication with the cluster failed."""


class ObjectStoreFullError(RayError):
    """The object store is full."""


class OutOfDiskError(RayError):
    """The node's disk is full."""


class OutOfMemoryError(RayError):
    """The node ran out of memory and a worker was killed."""


class NodeDiedError(RayError):
    """A node died."""


class PlasmaObjectNotAvailable(RayError):
    """An object was not available in time."""


class AsyncioActorExit(RayError):
    """An async actor exits."""


class RuntimeEnvSetupError(RayError):
    """A runtime_env could not be set up."""


class TaskPlacementGroupRemoved(RayError):
    """A task's placement group was removed."""


class ActorPlacementGroupRemoved(RayError):
    """An actor's placement group was removed."""


class PendingCallsLimitExceeded(RayError):
    """An actor has too many calls pending."""


class TaskUnschedulableError(RayError):
    """A task cannot be scheduled."""


class ActorUnschedulableError(RayError):
    """An actor cannot be scheduled."""


class UnserializableException(RayError):
    """An exception that could not be serialized."""
