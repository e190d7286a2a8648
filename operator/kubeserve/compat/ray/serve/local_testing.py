"""``serve.run(app, _local_testing_mode=True)``: the application in the driver's own process, as
Ray 2.60's ``local_testing_mode`` runs it.

No instance, no replicas, no HTTP: each deployment is constructed once, here, when ``serve.run``
is called (so a constructor's exception is raised by ``serve.run``), its ``user_config`` applied;
handles call it in-process. Calls run on the driver's event loop thread (coroutines there, sync
methods in a worker thread, as in a replica) and their arguments and results are copied through
cloudpickle, as a remote call would copy them, so a test does not pass by sharing an object a
real deployment could not share. As in Ray, ``runtime_env`` is ignored (a warning says so) and
requests are never rejected.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import cloudpickle

from kubeserve.compat.ray.serve.exceptions import RayServeException
from kubeserve.runtime.replica.user_code import (
    UserCode,
    generator_not_streamed,
    invoke,
    iterate,
    not_a_generator,
)
from kubeserve.sdk import context, transport
from kubeserve.sdk.application import Application
from kubeserve.sdk.handle import DeploymentHandle

__all__ = ["LocalTransport", "run_locally"]

log = logging.getLogger("ray.serve")


class LocalTransport:
    """The :class:`~kubeserve.sdk.transport.HandleTransport` of local testing mode: the user
    objects of every application run so far in this process, by ``(app, deployment)``."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], UserCode] = {}

    async def call(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
    ) -> Any:
        function = self._method(app, deployment, method)
        args, kwargs = _copied((args, kwargs))
        with _multiplexed(model_id):
            result = await invoke(function, *args, **kwargs)
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            result.close() if inspect.isgenerator(result) else await result.aclose()
            raise generator_not_streamed(method)
        return _copied(result)

    async def stream(
        self,
        app: str,
        deployment: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        model_id: str = "",
    ) -> AsyncIterator[Any]:
        function = self._method(app, deployment, method)
        args, kwargs = _copied((args, kwargs))
        with _multiplexed(model_id):
            items = await invoke(function, *args, **kwargs)
            if not (inspect.isgenerator(items) or inspect.isasyncgen(items)):
                raise not_a_generator(method)
            async for item in iterate(items, invoke):
                yield _copied(item)

    def _method(self, app: str, deployment: str, method: str) -> Any:
        code = self.objects.get((app, deployment))
        if code is None:
            raise RuntimeError(
                f"deployment {deployment!r} of application {app!r} is not running in this "
                "process (local testing mode)"
            )
        function = code.target if code.is_function else code.method(method)
        if function is None:
            # Ray's words, naming the methods a call may name (not those starting with "__")
            methods = [
                name
                for name in dir(code.target)
                if not name.startswith("__") and callable(getattr(code.target, name))
            ]
            raise RayServeException(
                f"Tried to call a method '{method}' that does not exist. "
                f"Available methods: {methods}."
            )
        return function


class _multiplexed:
    """The multiplexed model id a call carries, as a replica sets it for the user's code."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self._token: Any = None

    def __enter__(self) -> None:
        if self.model_id:
            request = context.RequestContext(multiplexed_model_id=self.model_id)
            self._token = context.request_context.set(request)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            context.request_context.reset(self._token)


def _copied(value: Any) -> Any:
    return cloudpickle.loads(cloudpickle.dumps(value))


_TRANSPORT = LocalTransport()


async def run_locally(target: Application, name: str) -> DeploymentHandle:
    """Construct every deployment of ``target`` as application ``name`` in this process and
    return a handle to its ingress; raises what a constructor or ``reconfigure`` raised."""
    for node in target.deployments():
        options = node.deployment.code_options
        if (options.get("ray_actor_options") or {}).get("runtime_env"):
            log.warning(
                "Deployment %r has runtime_env configured. runtime_envs are ignored in local "
                "testing mode.",
                node.name,
            )
        log.info("Initializing local replica class for %s/%s.", name, node.name)
        code = await UserCode.construct(node, name, replica_id="local")
        await code.reconfigure(options.get("user_config"))
        _TRANSPORT.objects[(name, node.name)] = code
    transport.set_transport(_TRANSPORT)
    return DeploymentHandle(name, target.name)
