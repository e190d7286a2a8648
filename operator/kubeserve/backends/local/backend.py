"""The local backend: desired state in SQLite, replicas and the proxy as child processes."""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

from aiohttp import web

from kubeserve.backends.local.controller import Controller, LocalSettings
from kubeserve.backends.local.details import instance_view
from kubeserve.backends.local.state_lock import StateDirLock
from kubeserve.backends.local.store import IMPERATIVE, DesiredState, Store, move_aside
from kubeserve.backends.protocol import ConflictError, NotFoundError, PreconditionFailedError
from kubeserve.backends.signed import answer_load_report, refuse_unsigned
from kubeserve.control import effective_config
from kubeserve.control.details import instance_details
from kubeserve.control.instance import (
    app_route_prefix,
    external_scaler_disabled,
    immutable_option_conflict,
    prefix_in_use,
)
from kubeserve.runtime import tracer, wire
from kubeserve.runtime.tls import TLSFileError, TLSFiles, check_files
from kubeserve.schema.errors import ErrorDetail
from kubeserve.schema.status import ServeInstanceDetails

_MAX_LONG_POLL_S = 60.0


class LocalBackend:
    """Implements :class:`kubeserve.backends.protocol.Backend` on one machine.

    The store owns desired state; the controller owns everything observed. An apply writes the store
    in one transaction and wakes the controller; it never touches processes itself.
    """

    def __init__(self, settings: LocalSettings) -> None:
        """Raises :class:`StateDirInUse` when another instance runs on the same state directory,
        :class:`CorruptStateError` when its database cannot be read (see ``reset_state``)."""
        self.settings = settings
        self._lock = StateDirLock(settings.state_dir)
        #: where ``reset_state`` moved the previous database (None: not reset, or there was none)
        self.previous_state = move_aside(settings.database) if settings.reset_state else None
        try:
            self.store = Store(settings.database)
        except BaseException:
            self._lock.release()
            raise
        self.controller = Controller(settings, self.store)

    async def start(self) -> None:
        await self.controller.start()

    async def close(self) -> None:
        await self.controller.close()
        self.store.close()
        self._lock.release()

    async def apply(
        self,
        instance: dict[str, Any],
        applications: list[dict[str, Any]],
        *,
        single_app: dict[str, Any] | None = None,
    ) -> None:
        current = self.store.load()
        conflict = immutable_option_conflict(current.options if current else None, instance)
        if single_app is None and not conflict:
            # the imperative applications the config does not list keep running (as in Ray):
            # a listed application may not take one of their routes
            listed = {app.get("name", "") for app in applications}
            kept = {
                name: prefix
                for name, prefix in self._live_prefixes(current).items()
                if name not in listed and self._is_imperative(current, name)
            }
            conflict = next(
                (
                    found
                    for app in applications
                    if (found := prefix_in_use(app["name"], app_route_prefix(app, {}), kept))
                ),
                None,
            )
        if conflict:
            raise ConflictError(conflict)
        self.store.replace(instance, applications, single_app)
        self.controller.wake()

    async def apply_imperative(
        self, instance: dict[str, Any], config: dict[str, Any], graph: bytes
    ) -> None:
        current = self.store.load()
        live = self._live_prefixes(current)
        conflict = prefix_in_use(config["name"], config.get("route_prefix"), live)
        if conflict:
            raise ConflictError(conflict)
        self.store.put_imperative(instance, config, graph)
        self.controller.wake()

    async def delete_application(self, name: str) -> None:
        self.store.delete_app(name)
        self.controller.wake()

    def _live_prefixes(self, desired: DesiredState | None) -> dict[str, str | None]:
        """The route prefix of every stored application (as served once it runs)."""
        prefixes: dict[str, str | None] = {}
        for stored in desired.applications if desired is not None else []:
            running = self.controller.apps.get(stored.name)
            if running is not None and running.uid == stored.uid and not running.deleting:
                prefixes[stored.name] = running.route_prefix
            else:
                prefixes[stored.name] = app_route_prefix(stored.config, {})
        return prefixes

    @staticmethod
    def _is_imperative(desired: DesiredState | None, name: str) -> bool:
        apps = desired.applications if desired is not None else []
        return any(app.name == name and app.api_type == IMPERATIVE for app in apps)

    def refusals(self, app_config: dict[str, Any]) -> list[ErrorDetail]:
        """``runtime_env.image_uri`` names a container image; replicas here are local processes."""
        return [
            {
                "loc": path,
                "msg": "image_uri is not supported by kubeserve start: its replicas are local "
                "processes, not containers (it picks the replica image on Kubernetes)",
            }
            for path in effective_config.runtime_env_key_paths(app_config, ["image_uri"])
        ]

    def instance_refusals(self, instance: dict[str, Any]) -> list[ErrorDetail]:
        """TLS files the proxy could not serve (unreadable, a key that is not the certificate's,
        a wrong password, an expired certificate), and tracing the data plane could not do (no
        OpenTelemetry, an exporter module that is not there): a 400 at the field, never a proxy
        that fails to start. Paths are read from this process, the proxy's parent, as the proxy
        will."""
        refusals: list[ErrorDetail] = []
        files = TLSFiles.from_http_options(instance.get("http_options") or {})
        if files is not None:
            try:
                check_files(files)
            except TLSFileError as exc:
                refusals.append({"loc": ["http_options", exc.field], "msg": str(exc)})
        # proxies and replicas import from this process's path and the directory it runs in
        search_path = [*sys.path, self.controller.settings.base_dir]
        cannot_trace = tracer.unavailable(instance.get("tracing_config"), search_path)
        if cannot_trace is not None:
            field, reason = cannot_trace
            refusals.append({"loc": ["tracing_config", field], "msg": reason})
        return refusals

    async def shutdown(self) -> None:
        self.store.clear()
        self.controller.wake()

    async def ensure_running(self, instance: dict[str, Any]) -> None:
        if self.store.load() is None:
            self.store.replace(instance, [], None)
            self.controller.wake()

    async def single_app_config(self) -> dict[str, Any] | None:
        state = self.store.load()
        return state.single_app if state is not None else None

    async def instance_details(self) -> ServeInstanceDetails:
        return instance_details(instance_view(self.controller, self.store.load()))

    async def scale_deployment(self, app: str, deployment: str, target_num_replicas: int) -> None:
        """Held in the controller's memory: a restarted ``kubeserve start`` runs the configured
        count again until the external scaler sets it anew."""
        desired = self.store.load()
        stored = next((a for a in desired.applications if a.name == app), None) if desired else None
        if stored is None:
            raise NotFoundError("Application or Deployment not found")
        if not stored.config.get("external_scaler_enabled"):
            raise PreconditionFailedError(external_scaler_disabled(app, deployment))
        state = self.controller.deployment(app, deployment)
        if state is None:
            raise NotFoundError("Application or Deployment not found")
        state.scaling.external_target = target_num_replicas
        self.controller.wake()

    async def metrics(self) -> bytes | None:
        return await asyncio.to_thread(self.controller.metrics_exposition)

    def internal_routes(self) -> list[web.RouteDef]:
        return [web.get(wire.SNAPSHOT_PATH, self._snapshot), web.get(wire.LOAD_PATH, self._load)]

    async def _load(self, request: web.Request) -> web.Response:
        """A caller's report of requests waiting for replicas (see ``runtime.load_report``)."""
        return answer_load_report(request, self.controller.secret, self.controller.record_queued)

    async def _snapshot(self, request: web.Request) -> web.Response:
        """The discovery long-poll of proxies and replicas (signed requests only)."""
        refused = refuse_unsigned(request, self.controller.secret)
        if refused is not None:
            return refused
        try:
            version = int(request.query.get("version", "0"))
            timeout = float(request.query.get("timeout", "30"))
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout < 0:
            return web.json_response(
                {"error": "version must be an integer and timeout a finite number >= 0"},
                status=400,
            )
        timeout = min(timeout, _MAX_LONG_POLL_S)
        snapshot = await self.controller.snapshots.wait(version, timeout)
        return web.json_response(snapshot)
