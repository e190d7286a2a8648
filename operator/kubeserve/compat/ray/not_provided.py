"""The public names of Ray 2.60's ``ray.serve`` (and of ``ray.util.metrics``, ``ray.exceptions``)
that kubeserve does not provide, each with the reason: the one table of them.

Every other public name of the snapshot ``tests/reference/ray-2.60/public-names.json`` is provided
(a test holds the two to each other). A key is a dotted name, a module's (``ray.serve.llm``: all of
its names) or a single name's (``ray.serve.run_many``), or a field of a class
(``ray.serve.config.HTTPOptions.middlewares``) that kubeserve's class lacks.

Asking for a name here fails with :class:`NotProvidedError` naming the reason, from the module's
``__getattr__`` (``from ray.serve import run_many``) or from the import of a module
(``import ray.serve.llm``, through :mod:`kubeserve.sdk.ray_namespace`).

This module is data only and imports nothing: every compatibility module and the ``ray`` finder
load it on a miss, at no cost to a replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

__all__ = ["REASONS", "NotProvidedError", "missing", "module_getattr", "reason"]

_GANG = (
    "gang scheduling places replicas on Ray's nodes with placement groups; kubeserve places "
    "replicas as Kubernetes pods (affinity, topology spread) and refuses gang_scheduling_config"
)
_DEPLOYMENT_ACTORS = (
    "deployment actors are Ray actors shared by a deployment's replicas; kubeserve runs no Ray "
    "actors (a shared service is a deployment of its own, called with a handle)"
)
_TASK_QUEUE = (
    "Serve's task consumers run deployments off a Celery/Taskiq broker queue; kubeserve serves "
    "HTTP and handle calls only"
)
_NO_TRACING = (
    "kubeserve's replicas record no OpenTelemetry spans, so there is no trace context to read "
    "(get_trace_context)"
)

#: Fields of Ray's ``HTTPOptions`` that kubeserve's (its admin API's ``http_options``) lacks.
_HTTP_OPTIONS_FIELDS = {
    "location": (
        "where proxies run is the Helm chart's or `kubeserve start`'s choice, not a field"
    ),
    "middlewares": (
        "Ray's proxy middlewares are deprecated; wrap the ingress with FastAPI middleware"
    ),
    "num_cpus": "proxies' resources are set by their pods' requests",
    "root_url": "deprecated by Ray; clients use the proxy's address",
}

#: dotted name -> why kubeserve does not provide it
REASONS: dict[str, str] = {
    # -- whole modules ----------------------------------------------------------------------------
    "ray.serve.llm": (
        "Ray Serve LLM runs vLLM engines inside Ray actors (placement groups, Ray's object "
        "store); kubeserve does not provide it: serve an LLM from your own deployment class"
    ),
    "ray.serve.gradio_integrations": (
        "GradioIngress is not provided: mount a Gradio app with serve.ingress(FastAPI app)"
    ),
    "ray.serve.task_consumer": _TASK_QUEUE,
    "ray.serve.task_processor": _TASK_QUEUE,
    "ray.serve.taskiq_task_processor": _TASK_QUEUE,
    "ray.serve.dag": (
        "InputNode builds Ray's deprecated DAG API (DAGDriver graphs); compose deployments with "
        "handles, as Ray's documentation does since 2.7"
    ),
    "ray.serve.autoscaling_policy": (
        "Ray's default policy is built into kubeserve's controller (its import path, the default "
        "policy_function, names it); custom policies are your own functions, and the helpers "
        "Ray's policies import from this module are not provided"
    ),
    # -- ray.serve ---------------------------------------------------------------------------------
    "ray.serve._run": "Ray's private deploy entry point; call serve.run",
    "ray.serve._run_many": "Ray's private deploy entry point; call serve.run for each application",
    "ray.serve.run_many": (
        "deploying several applications in one call is not provided: call serve.run for each"
    ),
    "ray.serve.RunTarget": "the argument of serve.run_many, which is not provided",
    "ray.serve.get_deployment_actor": _DEPLOYMENT_ACTORS,
    "ray.serve.get_deployment_actor_context": _DEPLOYMENT_ACTORS,
    "ray.serve.get_trace_context": _NO_TRACING,
    "ray.serve.utils": _NO_TRACING,
    # -- ray.serve.config --------------------------------------------------------------------------
    "ray.serve.config.GangPlacementStrategy": _GANG,
    "ray.serve.config.GangRuntimeFailurePolicy": _GANG,
    # -- ray.serve.schema --------------------------------------------------------------------------
    "ray.serve.schema.CeleryAdapterConfig": _TASK_QUEUE,
    "ray.serve.schema.TaskProcessorAdapter": _TASK_QUEUE,
    "ray.serve.schema.TaskProcessorConfig": _TASK_QUEUE,
    "ray.serve.schema.TaskResult": _TASK_QUEUE,
    # -- ray.serve.handle ------------------------------------------------------------------------
    "ray.serve.handle.DeploymentBroadcastResponse": (
        "broadcasting a call to every replica (handle.options(_broadcast=True)) is not provided"
    ),
    # -- fields of ray.serve.config.HTTPOptions (also ray.serve.HTTPOptions) ----------------------
    **{
        f"{cls}.{field}": why
        for cls in ("ray.serve.config.HTTPOptions", "ray.serve.HTTPOptions")
        for field, why in _HTTP_OPTIONS_FIELDS.items()
    },
}


class NotProvidedError(ImportError):
    """A public name of Ray 2.60 that kubeserve does not provide; the message says why.

    An :class:`ImportError`, not an :class:`AttributeError`: ``from ray.serve import run_many``
    would replace an ``AttributeError`` with Python's own "cannot import name" and lose the
    reason.
    """


def reason(dotted: str) -> str | None:
    """Why ``dotted`` (a ``ray...`` name) is not provided: its own entry or its module's."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        found = REASONS.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def ray_name(module: str) -> str:
    """``kubeserve.compat.ray.serve.config`` -> ``ray.serve.config``."""
    return module[module.index("ray") :] if module.startswith("kubeserve.compat.") else module


def missing(module: str, name: str) -> AttributeError | NotProvidedError:
    """The error for ``getattr(module, name)`` of a name a compatibility module lacks (its module
    ``__getattr__`` raises it): :class:`NotProvidedError` when the table lists it, else the
    ``AttributeError`` Python would raise."""
    dotted = f"{ray_name(module)}.{name}"
    why = reason(dotted) if not name.startswith("__") else None
    if why is None:
        return AttributeError(f"module {ray_name(module)!r} has no attribute {name!r}")
    return NotProvidedError(f"{dotted} is not provided by kubeserve: {why}", name=dotted)


def module_getattr(module: str) -> Callable[[str], NoReturn]:
    """A compatibility module's ``__getattr__``: every name it lacks fails as :func:`missing`
    says (``__getattr__ = module_getattr(__name__)`` at the end of the module)."""

    def __getattr__(name: str) -> NoReturn:
        raise missing(module, name)

    return __getattr__
