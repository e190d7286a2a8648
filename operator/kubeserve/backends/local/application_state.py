"""One application on the local machine: its build and its deployments.

The build (a subprocess importing ``import_path``) runs only when what it depends on changes: the
import path, the runtime_env and the application args. Any other change (overrides, ``user_config``,
replica counts) is applied to the existing deployments at once, which is what keeps a
``user_config`` change in the tens of milliseconds.

A rebuild never interrupts traffic. While it runs (and if it fails) the deployments of the previous
build keep serving, untouched. Once it is done, deployments it shares with the previous graph roll
their replicas (an old replica stops only once a new one serves), and deployments only the previous
graph had are *retiring*: they keep running, and the route keeps pointing at the previous ingress,
until every deployment of the new graph is HEALTHY; then the route moves and, once proxies have
had ``DISCOVERY_SETTLE_S`` to apply the move, they stop (a request the proxy matched to the
previous ingress before it learned the move is still served).

Each retiring deployment has its own clock: it stops ``DISCOVERY_SETTLE_S`` after the route last
left it (the switch to a serving graph without it, or at once when a graph that never served is
replaced), whatever newer graph is still starting. Graphs deployed back to back (a driver script
calling ``serve.run`` several times, one script after another) therefore never pile up replicas.
And a new version that does not fit beside the previous one (its replicas wait for resources the
retiring deployments hold) stops them at once rather than wait forever for room they keep: the
application then answers 503 until the new version is up, as a first deploy would.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubeserve.backends.local import adoption, processes
from kubeserve.backends.local.adoption import AdoptedReplica
from kubeserve.backends.local.deployment_state import DISCOVERY_SETTLE_S, DeploymentState
from kubeserve.backends.local.policy_process import PolicyLaunch, PolicyProcess
from kubeserve.backends.local.replica_context import ReplicaContext
from kubeserve.control import effective_config
from kubeserve.control.autoscaling import Direction
from kubeserve.control.autoscaling_state import ask_policy
from kubeserve.control.instance import app_route_prefix
from kubeserve.control.status_derivation import AppStatusInfo, BuildView, application_status
from kubeserve.runtime import runtime_env as runtime_envs
from kubeserve.runtime.runtime_env import PreparedEnv, RuntimeEnvError
from kubeserve.schema.config import is_default_policy
from kubeserve.schema.imperative import GRAPH_DIGEST_KEY

log = logging.getLogger(__name__)

_BUILD_TIMEOUT_S = 300.0


class ApplicationState:
    """One incarnation of an application: ``uid`` is the store's, and an application deleted and
    created again under the same name is a new :class:`ApplicationState` (the old one stops first).
    """

    def __init__(
        self,
        name: str,
        uid: str,
        context: ReplicaContext,
        cache_dir: Path,
        builds: asyncio.Semaphore | None = None,
    ) -> None:
        """``builds`` bounds the build processes of the whole instance running at once (shared
        by every application: a PUT of a thousand applications must not fork a thousand
        interpreters); None: no bound."""
        self.name = name
        self._builds = builds
        self.uid = uid
        self._ctx = context
        self._cache_dir = cache_dir
        self.config: dict[str, Any] = {}
        self.deployed_at = 0.0
        #: an application deployed with ``serve.run``: its pickled graph, which the build and
        #: the replicas load instead of importing ``import_path`` (None: declarative)
        self.pickled_graph: bytes | None = None
        self.build = BuildView("running")
        #: the latest successful build: what the deployments converge to
        self.graph: dict[str, Any] | None = None
        #: the graph whose ingress the route points to (the previous one during a switch)
        self.serving_graph: dict[str, Any] | None = None
        self.deployments: dict[str, DeploymentState] = {}
        #: deployments of the previous graph only, serving until the new graph is HEALTHY
        self.retiring: dict[str, DeploymentState] = {}
        #: retiring deployment -> when it stops (monotonic): set once no serving graph has it
        self._retire_at: dict[str, float] = {}
        self.deleting = False
        #: why the config does not fit the built graph (the app is DEPLOY_FAILED); reset each pass
        self.config_error = ""
        self._build_key = ""
        #: where the application's custom autoscaling policies run (started on first use)
        self.policies = PolicyProcess(self._policy_launch)
        self._build_task: asyncio.Task[None] | None = None
        self._envs: dict[str, PreparedEnv] = {}
        #: deployment environments being prepared (by runtime_env fingerprint), off the pass
        self._env_tasks: dict[str, asyncio.Task[PreparedEnv]] = {}
        #: what a deployment waits for while its packages are installed (the app's message)
        self._installing = ""
        self._install_notes: dict[str, str] = {}
        #: the instance's ``target_capacity`` and its direction, set by the controller each pass
        self.capacity: tuple[float | None, Direction | None] = (None, None)
        #: the instance's ``http_options.root_path``, set by the controller each pass (fixed
        #: while the serving layer runs)
        self.http_root_path = ""
        #: the instance's ``tracing_config`` when it enables tracing, likewise
        self.tracing_config: dict[str, Any] | None = None
        #: replicas an earlier run left serving, by deployment, until the first build places them
        self._adoptable: dict[str, list[AdoptedReplica]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def adopt(self, replicas: list[AdoptedReplica]) -> None:
        """Replicas of this incarnation an earlier run left serving: once built, each deployment
        of the graph takes its own, and the others are stopped."""
        for replica in replicas:
            self._adoptable.setdefault(replica.record.deployment, []).append(replica)

    @property
    def adoption_done(self) -> bool:
        """Every adopted replica was taken by its deployment or stopped."""
        return not self._adoptable

    def stop_adoptable(self) -> None:
        """Stop the adopted replicas no deployment took (the graph lost theirs, the build failed,
        the application goes, or the controller gave up waiting)."""
        unwanted = [replica for replicas in self._adoptable.values() for replica in replicas]
        self._adoptable.clear()
        adoption.stop_unwanted(unwanted, self._ctx.records, self._stopping)

    # -- desired state ---------------------------------------------------------------------------
    def set_config(
        self, config: dict[str, Any], deployed_at: float, pickled_graph: bytes | None = None
    ) -> None:
        """``pickled_graph`` is an imperative application's graph (its digest in ``config``)."""
        if config != self.config:  # a failed deployment environment is tried again
            failed = [k for k, t in self._env_tasks.items() if t.done()]  # done here: failed
            for key in failed:
                del self._env_tasks[key]
        self.config, self.deployed_at = config, deployed_at
        self.pickled_graph = pickled_graph
        build_inputs = [config.get("import_path"), config.get("runtime_env"), config.get("args")]
        if GRAPH_DIGEST_KEY in config:
            build_inputs.append(config[GRAPH_DIGEST_KEY])
        build_key = effective_config.fingerprint(build_inputs)
        if build_key != self._build_key:
            self._build_key = build_key
            self.policies.stop()  # the next decision starts it with the new code
            if self._build_task is not None:
                self._build_task.cancel()
            self.build = BuildView("running")  # what the previous build runs keeps serving
            log.info("application %r: building %s", self.name, self._code_source)
            self._build_task = asyncio.ensure_future(self._run_build(build_key))

    @property
    def api_type(self) -> str:
        """Ray's ``APIType`` value: ``imperative`` for an application deployed with serve.run."""
        return "declarative" if self.pickled_graph is None else "imperative"

    @property
    def _code_source(self) -> str:
        if self.pickled_graph is not None:
            return "the graph deployed with serve.run"
        return str(self.config.get("import_path"))

    @property
    def route_prefix(self) -> str | None:
        ingress = self.ingress_options()
        return app_route_prefix(self.config, ingress)

    def ingress_name(self) -> str | None:
        """The deployment the application's route leads to (``None`` before the first build)."""
        return None if self.serving_graph is None else str(self.serving_graph["ingress"])

    def ingress_options(self) -> dict[str, Any]:
        for node in (self.serving_graph or {}).get("deployments", []):
            if node.get("is_ingress"):
                return dict(node.get("options", {}))
        return {}

    def all_deployments(self) -> dict[str, DeploymentState]:
        """Every deployment with processes: the current graph's and the retiring ones."""
        return {**self.retiring, **self.deployments}

    # -- build -----------------------------------------------------------------------------------
    async def _run_build(self, build_key: str) -> None:
        if self._builds is None:
            await self._build(build_key)
            return
        async with self._builds:
            await self._build(build_key)

    async def _build(self, build_key: str) -> None:
        def installing(what: str) -> None:
            if build_key == self._build_key:
                self.build = BuildView("running", note=f"installing the packages of {what}")

        try:
            env = await self._prepare_env(None, installing)
            child_env = self._ctx.child_env(env.env_vars, env.python_path)
            if self.pickled_graph is not None:
                args = ["--pickled"]
            else:
                args = [str(self.config["import_path"])]
                args += ["--args", json.dumps(self.config.get("args") or {})]
            if self.tracing_config:  # its exporter must import where the application runs
                args += ["--tracing-config", json.dumps(self.tracing_config)]
            code, out, err = await processes.run_to_completion(
                "kubeserve.runtime.build",
                args,
                env=child_env,
                cwd=env.cwd or self._ctx.base_dir,
                timeout_s=_BUILD_TIMEOUT_S,
                stdin=self.pickled_graph,
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
            log.warning("%s", self.build.error)
            self.stop_adoptable()
        else:
            self.graph, self.build = graph, BuildView("done")
            log.info(
                "application %r: built, deployments %s",
                self.name,
                ", ".join(d["name"] for d in graph.get("deployments", [])),
            )
            if self.serving_graph is None:
                self.serving_graph = graph
        self._ctx.wake()

    def _env_key(self, deployment_env: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        merged = runtime_envs.merge_runtime_env(self.config.get("runtime_env"), deployment_env)
        return effective_config.fingerprint(merged), merged

    async def _prepare_env(
        self,
        deployment_env: Mapping[str, Any] | None,
        on_install: Callable[[str], None] | None = None,
    ) -> PreparedEnv:
        key, merged = self._env_key(deployment_env)
        if key not in self._envs:
            prepared = await runtime_envs.prepare(merged, self._cache_dir, on_install=on_install)
            self._envs[key] = prepared
        return self._envs[key]

    async def _deployment_env(
        self, name: str, deployment_env: Mapping[str, Any] | None
    ) -> PreparedEnv | None:
        """The deployment's environment. One with packages not installed yet is prepared off
        the controller's pass (an install may take minutes): None says to come back.
        ``RuntimeEnvError`` when it failed."""
        key, merged = self._env_key(deployment_env)
        if key in self._envs:
            return self._envs[key]
        if key not in self._env_tasks and not runtime_envs.asks_for_packages(merged):
            return await self._prepare_env(deployment_env)
        task = self._env_tasks.get(key)
        if task is None:
            self._install_notes[key] = f"deployment {name!r}: preparing its runtime_env"

            def installing(what: str) -> None:
                self._install_notes[key] = f"deployment {name!r}: installing the packages of {what}"
                self._ctx.wake()

            task = asyncio.ensure_future(self._prepare_env(deployment_env, installing))
            task.add_done_callback(lambda _: self._ctx.wake())
            self._env_tasks[key] = task
        if not task.done():
            self._installing = self._installing or self._install_notes[key]
            return None
        if task.exception() is None:  # a failure stays (DEPLOY_FAILED) until the config changes
            del self._env_tasks[key]
            self._install_notes.pop(key, None)
        return task.result()

    def python_envs(self) -> set[str]:
        """The package environments this application's current config maps to."""
        return {env.python_env for env in self._envs.values() if env.python_env}

    # -- reconciliation --------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Bring deployments in line with the built graph and the config's overrides."""
        if self.deleting or self.graph is None:
            return
        if self.build.state != "done":
            # A rebuild runs (or failed): the previous version keeps serving exactly as it was.
            for state in self.all_deployments().values():
                state.reconcile()
            self._stop_retired()
            return
        self.config_error = ""
        await self._converge(self.graph)
        self._switch_route_when_ready(self.graph)
        self._make_room_for(self.graph)
        self._stop_retired()

    async def _converge(self, graph: dict[str, Any]) -> None:
        overrides = {d["name"]: d for d in self.config.get("deployments", [])}
        wanted = {node["name"]: node for node in graph["deployments"]}
        error = effective_config.unknown_override_error(overrides.values(), wanted)
        if error:
            self.config_error = f"invalid deployments overrides: {error}"
            return  # what runs keeps running; nothing is started for a config that cannot apply
        serving = self._serving_names()
        for name in list(self.deployments):
            if name not in wanted:
                self.retiring[name] = self.deployments.pop(name)
                if name not in serving:  # of a graph the route never reached
                    self._retire_after(name, DISCOVERY_SETTLE_S)
        for state in self.retiring.values():
            state.reconcile()
        graph_bytes = self.pickled_graph
        app_graph = None if graph_bytes is None else base64.b64encode(graph_bytes).decode()
        self._installing = ""
        used = {self._env_key(None)[0]}
        for name, effective in effective_config.graph_configs(self.config, wanted.values()).items():
            used.add(self._env_key(effective.actor_runtime_env)[0])
            try:
                env = await self._deployment_env(name, effective.actor_runtime_env)
            except RuntimeEnvError as exc:
                self.config_error = f"runtime_env of deployment {name!r}: {exc}"
                return
            if env is None:
                continue
            known = self.deployments.get(name) or self.retiring.pop(name, None)
            self._retire_at.pop(name, None)  # wanted again
            state = known or DeploymentState(self.name, name, self._ctx, self.uid)
            self.deployments[name] = state
            state.scaling.set_capacity(*self.capacity)
            state.scaling.policy_process = self.policies
            state.scaling.application_policy = (
                None
                if is_default_policy(self.config.get("autoscaling_policy"))
                else self._decide_application
            )
            if not self.config.get("external_scaler_enabled"):
                state.scaling.external_target = None
            state.set_target(
                effective,
                effective_config.replica_version(self.config, effective),
                env,
                str(self.config.get("import_path", "")),
                self.config.get("args") or {},
                self.route_prefix,
                app_graph=app_graph,
                http_root_path=self.http_root_path,
                tracing_config=self.tracing_config,
            )
            state.adopt_all(self._adoptable.pop(name, []))
            state.reconcile()
        if not any(not t.done() for t in self._env_tasks.values()):  # one may adopt later
            self.stop_adoptable()  # replicas of deployments the graph no longer has
        self._envs = {key: env for key, env in self._envs.items() if key in used}

    # -- custom autoscaling policies -------------------------------------------------------------
    async def _policy_launch(self) -> PolicyLaunch:
        """The policy process runs where the build ran: same environment, same code."""
        env = await self._prepare_env(None)
        if self.pickled_graph is not None:
            args, preamble = ["--pickled"], base64.b64encode(self.pickled_graph)
        else:
            args = ["--import-path", str(self.config["import_path"])]
            args += ["--args", json.dumps(self.config.get("args") or {})]
            preamble = b""
        return PolicyLaunch(
            args=[self.name or "default", *args],
            env=self._ctx.child_env(env.env_vars, env.python_path),
            cwd=env.cwd or self._ctx.base_dir,
            log_path=self._ctx.log_dir / f"autoscaling_policy_{self.name or 'default'}.log",
            preamble=preamble,
        )

    async def _decide_application(self) -> None:
        """The application's ``autoscaling_policy`` decides for all its autoscaling deployments
        at once (Ray 2.60: it takes precedence over their own policies); a deployment it leaves
        out keeps its count, a failure leaves every count as it was."""
        scaled = {n: d.scaling for n, d in self.deployments.items() if d.scaling.autoscaler}
        members = {n: m for n, s in scaled.items() if (m := s.policy_member()) is not None}
        policy = self.config["autoscaling_policy"]
        outcome = await ask_policy(self.policies.ask, "application", policy, members, time.time)
        if outcome.error:
            log.warning("application %r: autoscaling policy failed: %s", self.name, outcome.error)
        for name in outcome.changed:
            scaled[name].announce()

    def _switch_route_when_ready(self, graph: dict[str, Any]) -> None:
        """Point the route at ``graph``'s ingress once all its deployments are HEALTHY, then stop
        the retiring deployments (only then: the previous ingress may call them until the move)."""
        if self.serving_graph is not graph:
            statuses = self.status().deployments
            if statuses and all(info.status == "HEALTHY" for info in statuses.values()):
                self.serving_graph = graph
                self._ctx.wake()  # publish the route now
                for name in self.retiring:  # none is in the graph the route now leads to
                    self._retire_after(name, DISCOVERY_SETTLE_S)

    def _serving_names(self) -> set[str]:
        return {node["name"] for node in (self.serving_graph or {}).get("deployments", [])}

    def _retire_after(self, name: str, delay_s: float) -> None:
        """Stop retiring deployment ``name`` in ``delay_s`` (or sooner if already due)."""
        at = time.monotonic() + delay_s
        if at < self._retire_at.get(name, float("inf")):
            self._retire_at[name] = at
            asyncio.get_running_loop().call_later(delay_s, self._ctx.wake)

    def _stop_retired(self) -> None:
        """Stop the retiring deployments whose time came; forget those with no process left."""
        now = time.monotonic()
        for name, state in list(self.retiring.items()):
            if now < self._retire_at.get(name, float("inf")):
                continue
            state.retired = True  # its reconcile must not start what this stops
            state.stop_all()
            if not state.replicas:
                del self.retiring[name]
                self._retire_at.pop(name, None)

    def _make_room_for(self, graph: dict[str, Any]) -> None:
        """A new version whose replicas wait for resources the retiring deployments hold would
        wait forever (they stop only once it serves): stop them now."""
        if self.serving_graph is graph:
            return
        holding = [
            name
            for name, state in self.retiring.items()
            if name not in self._retire_at and state.replicas
        ]
        waiting = [n for n, s in self.deployments.items() if s.unschedulable]
        if not holding or not waiting:
            return
        log.warning(
            "application %r: the new version does not fit beside the previous one (%s wait "
            "for resources): stopping the previous version's %s now; the application answers "
            "503 until the new version is up",
            self.name,
            ", ".join(waiting),
            ", ".join(holding),
        )
        for name in holding:
            self._retire_after(name, 0.0)

    def status(self) -> AppStatusInfo:
        """RUNNING only once the deployed version serves: a built graph whose deployments are not
        all up yet, or whose route has not moved to its ingress, is DEPLOYING (the previous
        version serving meanwhile), as Ray's application is until its new version runs."""
        views = {name: d.view() for name, d in self.deployments.items()}
        build = BuildView("failed", self.config_error) if self.config_error else self.build
        if build.state == "done" and self._installing:
            build = BuildView("running", note=self._installing)
        info = application_status(build, views, deleting=self.deleting)
        if info.status == "RUNNING" and self.serving_graph is not self.graph:
            return AppStatusInfo(
                "DEPLOYING", "the new version starts; the previous one serves", info.deployments
            )
        return info

    def begin_delete(self) -> None:
        log.info("application %r: deleting", self.name)
        self.deleting = True
        self.stop_adoptable()
        if self._build_task is not None:
            self._build_task.cancel()
        self.policies.stop()
        for deployment in self.all_deployments().values():
            deployment.stop_all()

    @property
    def stopped(self) -> bool:
        return all(not d.replicas for d in self.all_deployments().values())


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
