"""``ray.serve`` on kubeserve: Ray Serve 2.60's Python API over kubeserve's SDK.

What a deployment module uses is the SDK itself under Ray's names (``serve.deployment`` is
:func:`kubeserve.sdk.deployment.deployment`, which takes every option of Ray's decorator and either
honours it or refuses it naming it), so an application written for Ray builds the same graph a
kubeserve application does.

The driver-side API (``serve.run``, ``serve.start``, ``serve.status``, ``serve.delete``,
``serve.shutdown``, ``serve.get_app_handle``) manages a running instance: deploy through the admin
API (``serve deploy config.yaml``, or PUT /api/serve/applications/). Inside a replica,
``serve.get_deployment_handle`` gives a handle to any deployment.
"""

from __future__ import annotations

from typing import Any

from kubeserve.compat.ray.serve.config import HTTPOptions
from kubeserve.compat.ray.serve.exceptions import RayServeException
from kubeserve.schema.config import TracingConfig
from kubeserve.sdk import context as _context
from kubeserve.sdk.application import Application
from kubeserve.sdk.batching import batch
from kubeserve.sdk.deployment import Deployment, deployment
from kubeserve.sdk.handle import DeploymentHandle
from kubeserve.sdk.ingress import ingress
from kubeserve.sdk.multiplex import get_multiplexed_model_id, multiplexed

__all__ = [
    "Application",
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
    "ingress",
    "multiplexed",
    "run",
    "shutdown",
    "start",
    "status",
]


def get_replica_context() -> _context.ReplicaContext:
    """The replica this code runs in; raises :class:`RayServeException` outside a replica."""
    found = _context.get_replica_context()
    if found is None:
        raise RayServeException(
            "`serve.get_replica_context()` may only be called from within a Ray Serve deployment."
        )
    return found


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to ``deployment_name`` of ``app_name`` (default: the caller's application)."""
    if app_name is None:
        current = _context.get_replica_context()
        if current is None:
            raise RayServeException(
                "serve.get_deployment_handle() outside a replica needs app_name=..."
            )
        app_name = current.app_name
    return DeploymentHandle(app_name, deployment_name)


def _driver_api(name: str) -> RayServeException:
    return RayServeException(
        f"serve.{name}() is not available on kubeserve yet: deploy applications with the admin "
        "API (`serve deploy config.yaml -a http://127.0.0.1:8265`, or `kubeserve deploy`)"
    )


def run(target: Any, *args: Any, **kwargs: Any) -> Any:
    raise _driver_api("run")


def start(*args: Any, **kwargs: Any) -> None:
    raise _driver_api("start")


def status() -> Any:
    raise _driver_api("status")


def delete(name: str, _blocking: bool = True) -> None:
    raise _driver_api("delete")


def shutdown() -> None:
    raise _driver_api("shutdown")


def get_app_handle(name: str) -> DeploymentHandle:
    raise _driver_api("get_app_handle")
