"""Ray Serve's driver API (``serve.run``, ``serve.status``, ``serve.get_app_handle``...) against a
running kubeserve instance, from a script or a notebook.

The instance is reached the way the ``kubeserve`` command reaches it: the admin API at
``KUBESERVE_ADDRESS`` (default ``http://127.0.0.1:8265``, token ``KUBESERVE_AUTH_TOKEN``).
``serve.run(app)`` deploys imperatively, as Ray does: the application object itself, pickled,
over the admin API (``PUT /api/kubeserve/applications/{name}``); the instance's build and
replicas load it instead of importing a module, and a later config PUT that does not list it
leaves it running.

Every call goes through kubeserve's one admin client
(:class:`~kubeserve.admin_client.AdminClient`, the one behind the ``kubeserve`` command), run on
the driver's own event loop on a daemon thread, so it works from any thread, inside a running
event loop (a notebook) too.

Handles outside a replica: the first ``get_app_handle``/``get_deployment_handle`` of a process
starts a handle client on that same loop, authenticated with the instance's data-plane secret
(``data-plane.secret`` in its state directory, ``KUBESERVE_STATE_DIR`` or ``~/.kubeserve``: only
the user who runs the instance can read it). Calls from any thread or event loop run there
(``.result()``, ``await``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
import urllib.parse
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from kubeserve.admin_client import (
    APPLICATION_PATH,
    APPLICATIONS_PATH,
    DEFAULT_ADDRESS,
    AdminClient,
    AdminError,
)
from kubeserve.compat.ray.serve.exceptions import RayServeException
from kubeserve.compat.ray.serve.schema import (
    ApplicationStatusOverview,
    DeploymentStatusOverview,
    ServeStatus,
)
from kubeserve.runtime.handle_client import HandleClient
from kubeserve.sdk import context, transport
from kubeserve.sdk.application import Application
from kubeserve.sdk.handle import DeploymentHandle
from kubeserve.sdk.pickled_application import pickle_application

__all__ = [
    "delete",
    "get_app_handle",
    "get_deployment_handle",
    "run",
    "shutdown",
    "shutdown_async",
    "start",
    "status",
]

_T = TypeVar("_T")


def _address() -> str:
    return os.environ.get("KUBESERVE_ADDRESS", DEFAULT_ADDRESS).rstrip("/")


def _request(method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
    """One admin API call through kubeserve's admin client, on the driver's own loop."""
    client = AdminClient(_address(), os.environ.get("KUBESERVE_AUTH_TOKEN") or None)
    try:
        return _driver_loop().run(client.request(method, path, body), timeout_s)
    except AdminError as err:
        answer = err.body if isinstance(err.body, str) else json.dumps(err.body)
        raise RayServeException(f"{method} {path} answered {err.status}: {answer}") from None
    except (OSError, aiohttp.ClientError) as exc:
        raise RayServeException(
            f"no kubeserve instance answers at {_address()} ({exc}); start one with "
            "`kubeserve start`, or set KUBESERVE_ADDRESS"
        ) from None


def start(*args: Any, **kwargs: Any) -> None:
    """Check that the instance answers (kubeserve is started by ``kubeserve start``)."""
    _request("GET", "/api/ray/version")


# -- status ---------------------------------------------------------------------------------------


def status() -> ServeStatus:
    """The instance's applications and proxies, in Ray's ``ServeStatus`` shape."""
    details = _request("GET", APPLICATIONS_PATH)
    applications = {}
    for name, app in details.get("applications", {}).items():
        deployments = {}
        for dep_name, dep in app.get("deployments", {}).items():
            states: dict[str, int] = {}
            for replica in dep.get("replicas", []):
                states[replica["state"]] = states.get(replica["state"], 0) + 1
            deployments[dep_name] = DeploymentStatusOverview(
                dep["status"], dep.get("status_trigger", ""), states, dep.get("message", "")
            )
        applications[name] = ApplicationStatusOverview(
            app["status"], app.get("message", ""), app.get("last_deployed_time_s", 0.0), deployments
        )
    proxies = {node: proxy["status"] for node, proxy in details.get("proxies", {}).items()}
    return ServeStatus(proxies, applications, details.get("target_capacity"))


# -- deploying ------------------------------------------------------------------------------------


def _application_path(name: str) -> str:
    return APPLICATION_PATH.format(name=urllib.parse.quote(name, safe=""))


def _wait(name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = _request("GET", APPLICATIONS_PATH).get("applications", {}).get(name)
        if app is not None and app["status"] == "RUNNING":
            return
        if app is not None and app["status"] == "DEPLOY_FAILED":
            raise RayServeException(f"application {name!r} failed to deploy: {app['message']}")
        time.sleep(0.2)
    raise TimeoutError(f"application {name!r} was not RUNNING within {timeout_s:.0f} s")


def run(
    target: Application,
    blocking: bool = False,
    name: str = "default",
    route_prefix: str | None = "/",
    logging_config: Any = None,
    _local_testing_mode: bool = False,
    external_scaler_enabled: bool = False,
    *,
    timeout_s: float = 120.0,
) -> DeploymentHandle:
    """Deploy the application object ``target`` as application ``name`` (other applications
    keep running), wait until it runs and return a handle to its ingress; ``blocking`` then
    waits until interrupted.

    ``target`` is pickled here (:mod:`kubeserve.sdk.pickled_application`: code of ``__main__`` and
    of the script's own modules by value) and sent to the instance, so it may be defined
    anywhere: at a script's top level, in a function, under ``if __name__ == "__main__":``, in a
    notebook cell. In kubeserve's own build and replica processes (a module deployed by its
    import path that calls ``serve.run`` at its top level) it deploys nothing and returns a
    handle at once: the build must never wait on itself.

    ``_local_testing_mode=True`` runs the application in this process instead, no instance
    needed (:mod:`kubeserve.compat.ray.serve.local_testing`).
    """
    if not isinstance(target, Application):
        raise TypeError("serve.run takes a bound application (Deployment.bind(...))")
    if _local_testing_mode:
        from kubeserve.compat.ray.serve.local_testing import run_locally

        return _driver_loop().run(run_locally(target, name), timeout_s)
    if context.in_kubeserve_process():
        return DeploymentHandle(name, target.name)
    body: dict[str, Any] = {
        "route_prefix": route_prefix,
        "graph": base64.b64encode(pickle_application(target)).decode(),
    }
    if logging_config is not None:
        body["logging_config"] = _plain_logging_config(logging_config)
    if external_scaler_enabled:
        body["external_scaler_enabled"] = True
    _request("PUT", _application_path(name), body, timeout_s=60)
    _wait(name, timeout_s)
    handle = _run_handle(name)
    while blocking:
        time.sleep(3600)
    return handle


def _run_handle(name: str) -> DeploymentHandle:
    """``serve.run``'s handle to the ingress of ``name``. A driver that cannot reach the data
    plane (the operator's admin API on Kubernetes: replicas are inside the cluster, behind the
    instance's data-plane secret) still deploys; the handle's calls then fail saying why."""
    try:
        return get_app_handle(name)
    except _NoDataPlaneAccess as err:
        warnings.warn(f"serve.run deployed {name!r}; {err}", RuntimeWarning, stacklevel=3)
        app = _request("GET", APPLICATIONS_PATH).get("applications", {}).get(name) or {}
        ingress = (app.get("deployment_topology") or {}).get("ingress_deployment") or ""
        return DeploymentHandle(name, ingress)


def _plain_logging_config(logging_config: Any) -> Any:
    """A ``LoggingConfig`` model as the dict a config would hold; a dict as it is."""
    dump = getattr(logging_config, "model_dump", None)
    return dump(mode="json", exclude_unset=True) if callable(dump) else logging_config


def delete(name: str, _blocking: bool = True) -> None:
    """Remove application ``name``, however it was deployed (the others keep running)."""
    _request("DELETE", _application_path(name))
    deadline = time.monotonic() + 60
    while _blocking and time.monotonic() < deadline:
        if name not in _request("GET", APPLICATIONS_PATH).get("applications", {}):
            return
        time.sleep(0.2)


def shutdown() -> None:
    """Stop every application and the serving layer."""
    _request("DELETE", APPLICATIONS_PATH)
    with _DRIVER_LOCK:
        if _DRIVER is not None:
            _DRIVER.stop()


async def shutdown_async() -> None:
    """:func:`shutdown` for a caller on an event loop (it runs on a worker thread)."""
    await asyncio.to_thread(shutdown)


# -- handles --------------------------------------------------------------------------------------


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to the ingress deployment of application ``name``."""
    app = _request("GET", APPLICATIONS_PATH).get("applications", {}).get(name)
    if app is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    ingress = (app.get("deployment_topology") or {}).get("ingress_deployment")
    if not ingress:
        raise RayServeException(f"Application '{name}' has no ingress deployment yet.")
    _ensure_transport()
    return DeploymentHandle(name, ingress)


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to ``deployment_name`` of ``app_name`` (default: the caller's application inside
    a replica)."""
    if app_name is None:
        current = context.get_replica_context()
        if current is None:
            raise RayServeException(
                "serve.get_deployment_handle() outside a replica needs app_name=..."
            )
        app_name = current.app_name
    _ensure_transport()
    return DeploymentHandle(app_name, deployment_name)


class _DriverLoop:
    """An event loop on a daemon thread, started on the driver's first call: its admin calls and
    its handles' calls run there, whichever thread or event loop the script calls from."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="kubeserve-driver"
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        finally:
            future.cancel()  # a no-op once done; on a timeout, the call stops too


_LOOP: _DriverLoop | None = None
_LOOP_LOCK = threading.Lock()


def _driver_loop() -> _DriverLoop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = _DriverLoop()
        return _LOOP


class _NoDataPlaneAccess(RayServeException):
    """This driver holds no data-plane secret: its handles cannot call replicas."""


class _DriverTransport:
    """A :class:`HandleClient` on the driver's loop."""

    def __init__(self) -> None:
        state_dir = Path(os.environ.get("KUBESERVE_STATE_DIR", Path.home() / ".kubeserve"))
        secret_file = state_dir / "data-plane.secret"
        try:
            secret = secret_file.read_text().strip().encode()
        except OSError as exc:
            raise _NoDataPlaneAccess(
                f"handles outside a replica need the instance's {secret_file} ({exc}); set "
                "KUBESERVE_STATE_DIR to the instance's --state-dir"
            ) from None
        self.client = HandleClient(_address(), secret=secret)
        _driver_loop().run(self._start(), 30)

    async def _start(self) -> None:
        await self.client.start()
        transport.set_transport(self.client)

    def stop(self) -> None:
        async def close() -> None:
            transport.set_transport(None)
            await self.client.close()

        _driver_loop().run(close(), 30)


_DRIVER: _DriverTransport | None = None
_DRIVER_LOCK = threading.Lock()


def _ensure_transport() -> None:
    """Inside a replica the replica's transport serves; elsewhere start the driver's once."""
    global _DRIVER
    with _DRIVER_LOCK:
        try:
            transport.get_transport()
        except RuntimeError:
            _DRIVER = _DriverTransport()
