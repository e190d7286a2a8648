"""``ray.serve`` on kubeserve: Ray Serve 2.60's Python API over kubeserve's SDK.

What a deployment module uses is the SDK itself under Ray's names (``serve.deployment`` is
:func:`kubeserve.sdk.deployment.deployment`, which takes every option of Ray's decorator and either
honours it or refuses it naming it), so an application written for Ray builds the same graph a
kubeserve application does.

The driver-side API (``serve.run``, ``serve.start``, ``serve.status``, ``serve.delete``,
``serve.shutdown``, ``serve.get_app_handle``, ``serve.get_deployment_handle``) works against a
running kubeserve instance (:mod:`kubeserve.compat.ray.serve.driver`). It is loaded when a script
first touches it, never by a replica (an import contract in ``pyproject.toml`` keeps it so); the
config models (pydantic) load on first use too. Ray's public names kubeserve leaves out fail with
the reason (:mod:`kubeserve.compat.ray.not_provided`).
"""

from __future__ import annotations

import importlib
from typing import Any

from kubeserve.compat.ray import not_provided
from kubeserve.compat.ray.serve.exceptions import RayServeException
from kubeserve.compat.ray.serve.utils import get_trace_context
from kubeserve.sdk import context as _context
from kubeserve.sdk.application import Application
from kubeserve.sdk.batching import batch
from kubeserve.sdk.deployment import Deployment, deployment
from kubeserve.sdk.ingress import ingress
from kubeserve.sdk.multiplex import get_multiplexed_model_id, multiplexed

__all__ = [
    "Application",
    "ControllerOptions",
    "Deployment",
    "HTTPOptions",
    "TracingConfig",
    "batch",
    "delete",
    "deployment",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "get_trace_context",
    "ingress",
    "multiplexed",
    "run",
    "shutdown",
    "shutdown_async",
    "start",
    "status",
]


#: Names loaded on first use, by the module that holds them: the driver-side API (a replica
#: imports ``ray.serve`` for the decorator and never pays for the driver: its admin client, its
#: handle client on a thread), and the config models (a replica loads no pydantic for them).
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "delete",
            "get_app_handle",
            "get_deployment_handle",
            "run",
            "shutdown",
            "shutdown_async",
            "start",
            "status",
        ),
        f"{__name__}.driver",
    ),
    "ControllerOptions": f"{__name__}.config",
    "HTTPOptions": f"{__name__}.config",
    "TracingConfig": f"{__name__}.schema",
}
_missing = not_provided.module_getattr(__name__)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        _missing(name)
    return getattr(importlib.import_module(module), name)


def get_replica_context() -> _context.ReplicaContext:
    """The replica this code runs in; raises :class:`RayServeException` outside a replica."""
    found = _context.get_replica_context()
    if found is None:
        raise RayServeException(
            "`serve.get_replica_context()` may only be called from within a Ray Serve deployment."
        )
    return found
