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

import functools
import os
import pickle
import socket
import traceback
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
    """A task (here: a handle call) raised; ``cause`` is the callee's exception.

    As in Ray, the callee builds one (:func:`task_error`) and the caller raises
    :meth:`as_instanceof_cause`: an instance of both this class and the cause's class, so that
    ``except ValueError`` and ``except RayTaskError`` both catch it, whose ``str()`` is the
    callee's traceback under a line naming where it ran. A callee that lets a
    :class:`RayTaskError` of its own callee through is not wrapped twice: the cause stays the
    innermost exception and the traceback holds both (see :func:`task_error`).
    """

    def __init__(
        self,
        function_name: str,
        traceback_str: str,
        cause: Any,
        proctitle: str | None = None,
        pid: int | None = None,
        ip: str | None = None,
        actor_repr: str | None = None,
        actor_id: str | None = None,
    ) -> None:
        self.proctitle = proctitle or f"kubeserve::{function_name}"
        self.pid = pid or os.getpid()
        self.ip = ip or _node_ip()
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.actor_repr = actor_repr
        self._actor_id = actor_id
        self.cause = cause
        try:
            pickle.dumps(cause)
        except Exception as exc:  # as Ray: what cannot travel is replaced by a RayError saying so
            name = f"{type(cause).__module__}.{type(cause).__name__}"
            self.cause = RayError(
                f"Exception {name} isn't serializable: {exc}.\n"
                f"Original exception details:\n{traceback_str}"
            )
        self.args = (function_name, traceback_str, self.cause, proctitle, pid, ip)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _plain_task_error,
            (*self.args, self.actor_repr, self._actor_id),
        )

    def as_instanceof_cause(self) -> RayTaskError:
        """An exception that is an instance of both :class:`RayTaskError` and the cause's class,
        carrying the cause's attributes (Ray's ``as_instanceof_cause``); ``self`` when the cause's
        class cannot be subclassed."""
        cause_cls = type(self.cause)
        if issubclass(RayTaskError, cause_cls):
            return self
        try:
            return _dual_instance(self.cause, str(self))
        except Exception:
            return self

    def __str__(self) -> str:
        """The callee's traceback, kubeserve's own frames left out, each ``Traceback`` line
        replaced by where the call ran, as Ray formats it (without its terminal colours)."""
        where = f"{self.proctitle}() (pid={self.pid}, ip={self.ip}"
        where += f", actor_id={self._actor_id}, repr={self.actor_repr})" if self.actor_repr else ")"
        out: list[str] = []
        hidden = False
        for line in self.traceback_str.strip().split("\n"):
            if line.startswith("Traceback "):
                hidden = False
                out.append(where)
            elif line.startswith("  File ") and any(m in line for m in _INTERNAL_FRAMES):
                hidden = True
            elif hidden and line.startswith("    "):
                continue
            else:
                hidden = False
                out.append(line)
        return "\n".join(out)


#: frames of kubeserve's own machinery, left out of a :class:`RayTaskError`'s text as Ray leaves
#: out its workers' (``os.sep``-independent: tracebacks on kubeserve's platforms use ``/``)
_INTERNAL_FRAMES = ("/kubeserve/runtime/", "/kubeserve/sdk/", "/kubeserve/compat/")


def _plain_task_error(*args: Any) -> RayTaskError:
    return RayTaskError(*args)


@functools.cache
def _node_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


_DUAL_CLASSES: dict[type[BaseException], type[Any]] = {}


def _dual_class(cause_cls: type[BaseException]) -> type[Any]:
    """``RayTaskError(<cause's class name>)``: one class per cause class, named as Ray names it.

    Its instances pickle by value of their cause and text (:func:`_dual_instance`), so a callee
    can let one through to its own caller and a driver can pickle what it caught.
    """

    known = _DUAL_CLASSES.get(cause_cls)
    if known is not None:
        return known

    def __init__(self: Any, cause: BaseException, message: str) -> None:
        self.cause = cause
        self._ray_task_error_args = (cause,)
        self._message = message

    def args_get(self: Any) -> tuple[Any, ...]:
        return tuple(self._ray_task_error_args)

    def args_set(self: Any, value: tuple[Any, ...]) -> None:
        self._ray_task_error_args = value

    def __getattr__(self: Any, name: str) -> Any:
        if name in ("cause", "_message", "_ray_task_error_args"):
            raise AttributeError(name)
        return getattr(self.cause, name)

    namespace = {
        "__init__": __init__,
        "args": property(args_get, args_set),
        "__reduce__": lambda self: (_dual_instance, (self.cause, self._message)),
        "__getattr__": __getattr__,
        "__str__": lambda self: self._message,
        # where Ray's live: a traceback of a nested call names it ray.exceptions.RayTaskError(X)
        "__module__": "ray.exceptions",
    }
    name = f"RayTaskError({cause_cls.__name__})"
    bases: tuple[type, ...] = (RayTaskError, cause_cls)
    if issubclass(cause_cls, BaseExceptionGroup):
        namespace["__new__"] = lambda cls, cause, message: cause_cls.__new__(
            cls, cause.message, cause.exceptions
        )
    cls = type(name, bases, namespace)
    cls.__qualname__ = name
    _DUAL_CLASSES[cause_cls] = cls
    return cls


def _dual_instance(cause: BaseException, message: str) -> RayTaskError:
    dual: RayTaskError = _dual_class(type(cause))(cause, message)
    return dual


def task_error(
    exc: BaseException,
    function_name: str,
    *,
    proctitle: str | None = None,
    actor_repr: str | None = None,
    actor_id: str | None = None,
) -> RayTaskError:
    """The :class:`RayTaskError` a callee sends back for ``exc``, raised by ``function_name``.

    ``exc`` that is itself a :class:`RayTaskError` (a call this callee made failed, and it let the
    error through) keeps its cause: the caller's error is an instance of the innermost
    exception's class, and its text holds every hop's traceback, as in Ray.
    """
    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    text = "".join(traceback.format_exception(exc))
    return RayTaskError(
        function_name, text, cause, proctitle, actor_repr=actor_repr, actor_id=actor_id
    )


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
