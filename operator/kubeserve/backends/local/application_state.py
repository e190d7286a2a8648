"""One application on the local machine: its build and its deployments.

The build (a subprocess importing ``import_path``) runs only when what it depends on changes: the
import path, the runtime_env and the application args. Any other change (overrides, ``user_config``,
replica counts) is applied to the existing deployments at once, which is what keeps a
``user_config`` change in the tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kubeserve.backends.local import processes
from kubeserve.backends.local.deployment_state import DeploymentState, ReplicaContext
from kubeserve.control import config as config_rules
from kubeserve.control.instance import app_route_prefix
from kubeserve.control.status import AppStatusInfo, BuildView, application_status
from kubeserve.runtime import runtime_env as runtime_envs
from kubeserve.runtime.runtime_env import PreparedEnv, RuntimeEnvError

_BUILD_TIMEOUT_S = 300.0


class ApplicationState:
    """One incarnation of an application: ``uid`` is the store's, and an application deleted and
    created again under the same name is a new :class:`ApplicationState` (the old one stops first).
    """

    def __init__(self, name: str, uid: str, context: ReplicaContext, cache_dir: Path) -> None:
        self.name = name
        self.uid = uid
        self._ctx = context
        self._cache_dir = cache_dir
        self.config: dict[str, Any] = {}
        self.deployed_at = 0.0
        self.build = BuildView("running")
        self.graph: dict[str, Any] | None = None
        self.deployments: dict[str, DeploymentState] = {}
        self.deleting = False
        #: why the config's overrides do not fit the built graph (the app is DEPLOY_FAILED)
        self.config_error = ""
        self._build_key = ""
        self._build_task: asyncio.Task[None] | None = None
        self._envs: dict[str, PreparedEnv] = {}

    # -- desired state ---------------------------------------------------------------------------
    def set_config(self, config: dict[str, Any], deployed_at: float) -> None:
        self.config, self.deployed_at = config, deployed_at
        build_key = config_rules.fingerprint(
            [config.get("import_path"), config.get("runtime_env"), config.get("args")]
        )
        if build_key != self._build_key:
            self._build_key = build_key
            if self._build_task is not None:
                self._build_task.cancel()
            self.build, self.graph = BuildView("running"), None
            self._build_task = asyncio.ensure_future(self._run_build(build_key))

    @property
    def route_prefix(self) -> str | None:
        ingress = self.ingress_options()
        return app_route_prefix(self.config, ingress)

    def ingress_name(self) -> str | None:
        return None if self.graph is None else str(self.graph["ingress"])

    def ingress_options(self) -> dict[str, Any]:
        for node in (self.graph or {}).get("deployments", []):
            if node.get("is_ingress"):
                return dict(node.get("options", {}))
        return {}

    # -- build -----------------------------------------------------------------------------------
    async def _run_build(self, build_key: str) -> None:
        try:
            env = await self._prepare_env(None)
            child_env = self._ctx.child_env(env.env_vars, env.python_path)
            code, out, err = await processes.run_to_completion(
                "kubeserve.runtime.build",
                [str(self.config["import_path"])],
                env=child_env,
                cwd=env.cwd or self._ctx.base_dir,
                timeout_s=_BUILD_TIMEOUT_S,
            )
            graph = _parse_build_output(code, out, err)
        except RuntimeEnvError as exc:
            graph = {"error": f"runtime_env: {exc}"}
        if build_key != self._build_key:
            return
        if "error" in graph:
            self.build = BuildView(
                "failed", f"failed to build application {self.name!r}: {graph['error']}"
            )
        else:
            self.graph, self.build = graph, BuildView("done")
        self._ctx.wake()

    async def _prepare_env(self, deployment_env: dict[str, Any] | None) -> PreparedEnv:
        merged = runtime_envs.merge_runtime_env(self.config.get("runtime_env"), deployment_env)
        key = config_rules.fingerprint(merged)
        if key not in self._envs:
            self._envs[key] = await runtime_envs.prepare(merged, self._cache_dir)
        return self._envs[key]

    # -- reconciliation --------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Bring deployments in line with the built graph and the config's overrides."""
        if self.deleting or self.graph is None:
            return
        overrides = {d["name"]: d for d in self.config.get("deployments", [])}
        wanted = {node["name"]: node for node in self.graph["deployments"]}
        error = config_rules.unknown_override_error(overrides.values(), wanted)
        self.config_error = f"invalid deployments overrides: {error}" if error else ""
        if error:
            return  # what runs keeps running; nothing is started for a config that cannot apply
        for name in list(self.deployments):
            if name not in wanted:
                self.deployments[name].stop_all()
                if not self.deployments[name].replicas:
                    del self.deployments[name]
        for name, node in wanted.items():
            effective = config_rules.effective_deployment_config(
                name, node.get("options", {}), overrides.get(name)
            )
            actor_env = (effective.get("ray_actor_options") or {}).get("runtime_env")
            try:
                env = await self._prepare_env(actor_env)
            except RuntimeEnvError as exc:
                self.build = BuildView("failed", f"runtime_env of deployment {name!r}: {exc}")
                return
            state = self.deployments.get(name)
            if state is None:
                state = DeploymentState(self.name, name, str(self.config["import_path"]), self._ctx)
                self.deployments[name] = state
            state.set_target(effective, config_rules.replica_version(self.config, effective), env)
            state.reconcile()

    def status(self) -> AppStatusInfo:
        views = {name: d.view() for name, d in self.deployments.items()}
        build = BuildView("failed", self.config_error) if self.config_error else self.build
        return application_status(build, views, deleting=self.deleting)

    def begin_delete(self) -> None:
        self.deleting = True
        if self._build_task is not None:
            self._build_task.cancel()
        for deployment in self.deployments.values():
            deployment.stop_all()

    @property
    def stopped(self) -> bool:
        return all(not d.replicas for d in self.deployments.values())


def _parse_build_output(code: int, out: str, err: str) -> dict[str, Any]:
    """The build's JSON answer, or ``{"error": ...}`` with what an operator needs to read."""
    try:
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except (json.JSONDecodeError, IndexError):
        result = None
    if isinstance(result, dict) and (code == 0 or "error" in result):
        return result
    detail = (err or out).strip()[-2000:]
    return {"error": f"the build process exited with code {code}: {detail}"}
