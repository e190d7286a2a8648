"""Reconciling one ``ServeApplication``: build Job -> graph -> workloads -> status.

:class:`ApplicationReconciler` is the operator's one idempotent step for an application, shared
by the create, update and resume handlers and the periodic resync. It reads the cluster from the
operator's caches, writes only what differs (server-side apply of rendered objects it has not
applied in this form yet), never writes a spec, and returns what the status should say as a
typed report (:mod:`.reports`); the operator writes it.

A spec that validates but that the renderer refuses (:class:`~.render.RenderError`: a runtime_env
key Kubernetes cannot honour, an invalid resource name...) ends the pass in ``DEPLOY_FAILED``
with the renderer's message and a Warning Event; raising would only retry it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kubeserve.backends.kubernetes import render, reports
from kubeserve.backends.kubernetes.autoscaling import (
    SCALE_TO_ZERO_REFUSED,
    Autoscalers,
    external_replicas,
    scale_to_zero_paths,
    scaling_key,
)
from kubeserve.backends.kubernetes.cluster import CACHE_LAG_S, Cluster
from kubeserve.backends.kubernetes.data_plane import DataPlane
from kubeserve.backends.kubernetes.pods import creation_failure
from kubeserve.backends.kubernetes.policy_host import (
    PolicyHost,
    find_policy_host,
    needs_policy_host,
)
from kubeserve.backends.kubernetes.reports import (
    ApplicationRefused,
    ApplicationReport,
    IngressRoute,
    ObservedDeployment,
    deployment_view_from_pods,
)
from kubeserve.control import effective_config
from kubeserve.control.autoscaling import Direction
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.instance import app_route_prefix
from kubeserve.control.status_derivation import BuildView, application_status, deployment_status
from kubeserve.runtime import wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import KubeConflict
from kubeserve.runtime.kubernetes.graph import graph_document
from kubeserve.runtime.runtime_env import asks_for_packages
from kubeserve.schema.config import is_default_policy
from kubeserve.schema.errors import validation_details
from kubeserve.schema.resources import ServeApplicationSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Graph:
    """The build's answer for one build key: the deployments, or the error."""

    body: dict[str, Any]

    @property
    def error(self) -> str | None:
        error = self.body.get("error")
        return None if error is None else str(error)

    def configs(self, app_config: Mapping[str, Any]) -> dict[str, EffectiveDeployment]:
        """The effective config of each deployment of the graph, in the graph's order."""
        return effective_config.graph_configs(app_config, self.body["deployments"])


class ApplicationReconciler:
    """The operator's one idempotent step for a ``ServeApplication``.

    Owns the deployment versions that reached HEALTHY once in this process (a crash afterwards is
    UNHEALTHY, not DEPLOY_FAILED); the cluster and the data plane are shared with the instance
    reconciler.
    """

    def __init__(
        self, cluster: Cluster, data_plane: DataPlane, autoscalers: Autoscalers | None = None
    ) -> None:
        self._cluster = cluster
        self._data_plane = data_plane
        self._autoscalers = autoscalers or Autoscalers(on_decided=lambda _keys: None)
        #: namespace/application/deployment/version keys that reached HEALTHY once
        self._healthy_versions: set[str] = set()

    async def reconcile(self, obj: dict[str, Any]) -> ApplicationReport | ApplicationRefused:
        """Converge ``obj``'s children to its spec; what its status should say."""
        namespace = obj["metadata"]["namespace"]
        try:
            spec = ServeApplicationSpec.model_validate(obj.get("spec") or {})
            app_config = spec.app_config(name=contract.application_name(obj))
        except ValidationError as err:
            details = "; ".join(
                f"spec.{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in validation_details(err)
            )
            return ApplicationRefused("InvalidSpec", details)
        instance = self._cluster.cache.get("ServeInstance", namespace, spec.instance)
        if instance is None:
            message = f"ServeInstance {spec.instance!r} not found in namespace {namespace!r}"
            return ApplicationRefused("InstanceNotFound", message, "DEPLOYING")
        # the pass does not need its ownership by the instance: both are written at once
        owned = asyncio.ensure_future(_ensure_owned_by(self._cluster, obj, instance))
        try:
            return await self._reconcile_workloads(obj, instance, app_config)
        except render.RenderError as err:  # a spec Kubernetes cannot express: retrying cannot help
            return ApplicationRefused("DeployFailed", str(err))
        finally:
            await owned

    async def _reconcile_workloads(
        self, obj: dict[str, Any], instance: dict[str, Any], app_config: dict[str, Any]
    ) -> ApplicationReport:
        secret = await self._data_plane.secret(instance)  # replicas read it; pushes prove it
        await self._data_plane.node_sockets(instance)  # the replica pods' transport, first
        instance_view = self._data_plane.instance_view(instance)
        app_view = render.app_view(obj, app_config, instance_view.tracing_config)
        graph = await _graph(self._cluster, instance_view, app_view)
        if graph is None:
            note = _build_note(self._cluster, app_view, instance_view)
            return ApplicationReport(application_status(BuildView("running", note=note), {}))
        configs = {} if graph.error else graph.configs(app_config)
        error = (
            graph.error
            or _override_error(graph, app_config)
            or (None if instance_view.report_url else _scale_to_zero(configs))
        )
        if error is not None:
            return ApplicationReport(application_status(BuildView("failed", error), {}))
        inputs = ApplicationPass(
            obj,
            instance_view,
            app_view,
            configs,
            secret,
            external_replicas(obj) if app_config.get("external_scaler_enabled") else {},
            self._autoscalers.capacity(
                instance_view.uid,
                _instance_apps(self._cluster, instance),
                instance_view.target_capacity,
            ),
        )
        deployments = await self._reconcile_deployments(inputs)
        ingress = str(graph.body["ingress"])
        route_prefix = app_route_prefix(app_config, _node(graph, ingress).get("options", {}))
        return ApplicationReport(
            application_status(BuildView("done"), {n: d.view for n, d in deployments.items()}),
            deployments,
            IngressRoute(ingress, route_prefix, graph.body.get("docs_path")),
            provisional=any(d.awaiting_first_answer for d in deployments.values()),
        )

    async def _reconcile_deployments(
        self, inputs: ApplicationPass
    ) -> dict[str, ObservedDeployment]:
        """Each deployment of the graph: desired, converged, observed; then the workloads of
        deployments no longer in the graph go, and the autoscalers read the pods' load."""
        policy_host = await self._converge_policy_host(inputs)
        observed: dict[str, ObservedDeployment] = {}
        applied: list[dict[str, Any]] = []
        pods_by_key: dict[str, list[dict[str, Any]]] = {}
        # the deployments' objects are independent: written at once, each write waits for the
        # API server, and one after the other they made a pass a dozen round trips long
        desired = [self._desired(inputs, effective) for effective in inputs.configs.values()]
        converged = await asyncio.gather(
            *(self._converge(inputs, deployment, running) for deployment, running in desired)
        )
        for (deployment, _), (workload, service, budget) in zip(desired, converged, strict=True):
            pods = self._cluster.cache.objects(
                "Pod", inputs.app.namespace, dict(workload["spec"]["selector"]["matchLabels"])
            )
            pods_by_key[inputs.scaler_key(deployment.name)] = pods
            observed[deployment.name] = await self._observe(inputs, deployment, pods, service)
            applied += (workload, service) if budget is None else (workload, service, budget)
        labels = _component_labels(inputs.app, contract.COMPONENT_REPLICA)
        await self._cluster.prune(inputs.app.namespace, labels, _REPLICA_KINDS, applied)
        app_policy = inputs.app.config.get("autoscaling_policy")
        self._autoscalers.observe(
            pods_by_key,
            inputs.secret,
            None if is_default_policy(app_policy) else dict(app_policy or {}),
            policy_host,
        )
        return observed

    async def _converge_policy_host(self, inputs: ApplicationPass) -> PolicyHost | None:
        """The policy host pod of an application with a custom autoscaling policy (applied
        when it has one, deleted when it has none any more): where the autoscalers ask it."""
        app = inputs.app
        wanted = needs_policy_host(app.config, inputs.configs)
        workload = render.render_policy_workload(inputs.instance, app) if wanted else None
        if workload is not None:
            await self._cluster.apply(workload)
        labels = _component_labels(app, contract.COMPONENT_POLICY)
        keep = [] if workload is None else [workload]
        await self._cluster.prune(app.namespace, labels, ("Deployment",), keep)
        if workload is None:
            return None
        selector = dict(workload["spec"]["selector"]["matchLabels"])
        pods = self._cluster.cache.objects("Pod", app.namespace, selector)
        return find_policy_host(workload["metadata"]["name"], pods, inputs.secret)

    def _desired(
        self, inputs: ApplicationPass, effective: EffectiveDeployment
    ) -> tuple[render.DesiredDeployment, int | None]:
        """What to render for one deployment, and the replica count of its running workload
        (``None``: none runs yet), which an autoscaler adopts when it starts."""
        app = inputs.app
        existing = self._cluster.cache.get(
            "Deployment", app.namespace, contract.workload_name(app.cr_name, effective.name)
        )
        running = None if existing is None else (existing.get("spec") or {}).get("replicas")
        key = inputs.scaler_key(effective.name)
        autoscaled = self._autoscalers.target(key, effective, inputs.capacity, running)
        desired = desired_deployment(
            app.config, effective, autoscaled, inputs.external, inputs.capacity[0]
        )
        return desired, running

    async def _converge(
        self, inputs: ApplicationPass, deployment: render.DesiredDeployment, running: int | None
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
        """Apply the deployment's workload, Service and PodDisruptionBudget (a changed count is
        a ``Scaled`` Event)."""
        name, replicas = deployment.name, deployment.target_replicas
        if running is not None and replicas != running:
            decision = self._autoscalers.last_decision(inputs.scaler_key(name))
            why = _scale_reason(decision, name in inputs.external)
            message = f"deployment {name}: {running} -> {replicas} replicas ({why})"
            await self._cluster.event(inputs.obj, "Scaled", message, event_type="Normal")
        workload = render.render_replica_workload(inputs.instance, inputs.app, deployment)
        service = render.render_replica_service(inputs.instance, inputs.app, deployment)
        budget = render.render_replica_disruption_budget(inputs.instance, inputs.app, deployment)
        await asyncio.gather(*(self._cluster.apply(o) for o in (workload, service, budget) if o))
        return workload, service, budget

    async def _observe(
        self,
        inputs: ApplicationPass,
        deployment: render.DesiredDeployment,
        pods: list[dict[str, Any]],
        service: dict[str, Any],
    ) -> ObservedDeployment:
        """What the deployment's ``pods`` do; pushes ``user_config`` to those that lack it."""
        app, effective, key = inputs.app, deployment.config, inputs.scaler_key(deployment.name)
        await self._data_plane.push_user_config(pods, effective, inputs.secret, inputs.instance.uid)
        healthy_key = f"{app.namespace}/{app.cr_name}/{deployment.name}/{deployment.version}"
        view = deployment_view_from_pods(
            pods,
            effective,
            deployment.version,
            self._data_plane.user_configs,
            healthy_key in self._healthy_versions,
            deployment.target_replicas,
        )
        workload = self._cluster.cache.get(
            "Deployment", app.namespace, contract.workload_name(app.cr_name, deployment.name)
        )
        refused = creation_failure(workload)  # pods the cluster refuses: said with the progress
        view = dataclasses.replace(
            view,
            autoscaling_error=self._autoscalers.policy_error(key),
            unschedulable="; ".join(m for m in (view.unschedulable, refused) if m),
        )
        if deployment_status(view).status == "HEALTHY":
            self._healthy_versions.add(healthy_key)
        return ObservedDeployment(
            view,
            service["metadata"]["name"],
            effective.max_ongoing_requests,
            self._autoscalers.last_decision(key),
            wire.queue_limits(effective),
            _router_json(wire.request_router_spec(effective)),
            self._data_plane.awaiting_first_answer(pods),
        )


def _router_json(spec: wire.RequestRouterSpec | None) -> str | None:
    return None if spec is None else json.dumps(spec, sort_keys=True)


#: The kinds of a deployment's objects (a driver deployment's workload is a DaemonSet).
_REPLICA_KINDS = ("Deployment", "DaemonSet", "Service", "PodDisruptionBudget")


def _component_labels(app: render.AppView, component: str) -> dict[str, str]:
    """Selects the application's children of ``component`` (what a pass prunes among)."""
    return {
        contract.APPLICATION_LABEL: contract.label_value(app.cr_name),
        contract.COMPONENT_LABEL: component,
    }


@dataclass(frozen=True)
class ApplicationPass:
    """The inputs of one reconcile pass over an application's deployments, gathered once."""

    obj: dict[str, Any]
    instance: render.InstanceView
    app: render.AppView
    #: the effective config of each deployment of the built graph, in the graph's order
    configs: dict[str, EffectiveDeployment]
    #: the instance's data-plane secret (user_config pushes and load reads prove it)
    secret: bytes
    #: the counts set through the external scaling API, by deployment
    external: dict[str, int]
    #: the instance's ``target_capacity`` and its direction
    capacity: tuple[float | None, Direction | None]

    def scaler_key(self, deployment: str) -> str:
        return scaling_key(self.app.namespace, self.app.cr_name, deployment)


def desired_deployment(
    app_config: Mapping[str, Any],
    effective: EffectiveDeployment,
    autoscaled: int | None,
    external: Mapping[str, int],
    target_capacity: float | None,
) -> render.DesiredDeployment:
    """What one deployment should be (pure): its config and version, and its replica count: the
    autoscaler's decision (``autoscaled``), else the count set through the external scaling API,
    else the config's, ``target_capacity`` applied."""
    replicas = autoscaled
    if replicas is None:
        replicas = external.get(effective.name, effective.target_replicas(target_capacity))
    return render.deployment_view(app_config, effective, replicas)


def _instance_apps(cluster: Cluster, instance: dict[str, Any]) -> list[str]:
    """The object names of the instance's applications (``target_capacity``'s direction)."""
    meta = instance["metadata"]
    return [
        app["metadata"]["name"]
        for app in cluster.cache.objects("ServeApplication", meta["namespace"])
        if contract.instance_of(app) == meta["name"]
    ]


def _scale_to_zero(configs: Mapping[str, EffectiveDeployment]) -> str | None:
    """Why the application cannot run here when a deployment asks to scale to zero (in code or
    in the config), else None."""
    effective = list(configs.values())
    paths = scale_to_zero_paths(e.autoscaling_config for e in effective)
    if not paths:
        return None
    which = ", ".join(sorted({repr(effective[int(path[0])].name) for path in paths}))
    return f"deployment {which}: {SCALE_TO_ZERO_REFUSED}"


def _override_error(graph: Graph, app_config: dict[str, Any]) -> str | None:
    """Why the config's ``deployments`` overrides cannot apply to the built graph (as Ray: the
    application fails, naming them), or None."""
    names_in_graph = [str(node["name"]) for node in graph.body["deployments"]]
    error = effective_config.unknown_override_error(
        app_config.get("deployments", []), names_in_graph
    )
    return None if error is None else f"invalid deployments overrides: {error}"


def _node(graph: Graph, name: str) -> dict[str, Any]:
    for node in graph.body["deployments"]:
        if node["name"] == name:
            return dict(node)
    return {}


async def _ensure_owned_by(cluster: Cluster, obj: dict[str, Any], instance: dict[str, Any]) -> None:
    """Applications belong to their instance: deleting the instance deletes them (metadata only)."""
    owners = obj["metadata"].get("ownerReferences") or []
    uid = instance["metadata"]["uid"]
    if any(o.get("uid") == uid for o in owners):
        return
    ref = contract.owner_reference(instance, controller=False)
    await cluster.kube.merge_patch(
        "ServeApplication",
        obj["metadata"]["namespace"],
        obj["metadata"]["name"],
        {"metadata": {"ownerReferences": [*owners, ref]}},
    )


async def _graph(
    cluster: Cluster,
    instance: render.InstanceView,
    app: render.AppView,
) -> Graph | None:
    """The build result for the app's current code and environment; starts the Job when needed.

    The build is shared (:func:`~.render.build_name`): the app becomes an owner of its graph
    ConfigMap, or of its Job while it runs, and, once it has a graph, stops owning the builds
    it used before (:func:`_leave_other_builds`).
    """
    name = render.build_name(instance, app)
    owner = contract.owner_reference(app.owner(), controller=False, block_owner_deletion=False)
    configmap = cluster.cache.get("ConfigMap", app.namespace, name)
    legacy = cluster.cache.get("ConfigMap", app.namespace, render.own_graph_name(app))
    if configmap is None and legacy is not None:  # built before builds were shared: still good
        return Graph(graph_document(legacy))
    job = cluster.cache.get("Job", app.namespace, name)
    if configmap is not None:
        graph = Graph(graph_document(configmap))
        since = configmap["metadata"].get("creationTimestamp")
        joined = cluster.joining(f"ConfigMap/{app.namespace}/{name}", app.uid)
        if graph.error is not None and not joined and _retries(configmap, owner, since):
            await _delete_build(cluster, app.namespace, name, configmap, job)
            return None
        await cluster.add_owner("ConfigMap", app.namespace, name, configmap, owner)
        await _leave_other_builds(cluster, app, name)
        return graph
    if job is None:
        await cluster.create_owned(render.render_build_job(instance, app))
        return None
    status = job.get("status") or {}
    failed = _failed(status)
    joined = cluster.joining(f"Job/{app.namespace}/{name}", app.uid)
    if failed is not None and not joined and _retries(job, owner, failed.get("lastTransitionTime")):
        await _delete_build(cluster, app.namespace, name, None, job)
        return None
    await cluster.add_owner("Job", app.namespace, name, job, owner)
    if failed is not None:
        error = f"build Job {name} failed: {failed.get('message', '')}"
        pods = cluster.cache.objects("Pod", app.namespace, {"job-name": name})
        causes = [c for p in pods for c in reports.init_failures(p)]
        return Graph({"error": f"{error}; {causes[-1]}" if causes else error})
    if _graph_lost(status):  # its graph was deleted (its last owner gone): build again
        version = str(job["metadata"].get("resourceVersion") or "") or None
        with contextlib.suppress(KubeConflict):
            await cluster.kube.delete("Job", app.namespace, name, resource_version=version)
    return None


#: How old a shared build's failure must be before an application that did not own it gets a new
#: attempt (younger, it is shown the failure: many applications asking at once build once).
RETRY_FAILED_BUILD_S = 30.0


def _retries(build: Mapping[str, Any], owner: Mapping[str, Any], failed_at: Any) -> bool:
    """Whether an application gets a new attempt of a failed shared build: it did not own it
    (new, or deployed again to retry, as an unshared build would be built again: a failure may
    be transient, an image's tag may have moved) and the failure is older than
    :data:`RETRY_FAILED_BUILD_S` (the applications asking at once share one attempt)."""
    return str(owner["uid"]) not in _owners(build) and _age_s(failed_at) > RETRY_FAILED_BUILD_S


async def _delete_build(
    cluster: Cluster,
    namespace: str,
    name: str,
    configmap: Mapping[str, Any] | None,
    job: Mapping[str, Any] | None,
) -> None:
    """Delete a failed build's graph and Job (each at the version read: one that changed
    meanwhile is left to the next pass) so that the next pass builds again."""
    for kind, obj in (("ConfigMap", configmap), ("Job", job)):
        if obj is None:
            continue
        version = str(obj["metadata"].get("resourceVersion") or "") or None
        with contextlib.suppress(KubeConflict):
            await cluster.kube.delete(kind, namespace, name, resource_version=version)


def _failed(job_status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A build Job's ``Failed`` condition, if it failed."""
    for condition in job_status.get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return dict(condition)
    return None


def _owners(obj: Mapping[str, Any]) -> set[str]:
    return {str(o.get("uid")) for o in obj["metadata"].get("ownerReferences") or []}


def _age_s(stamp: Any) -> float:
    """Seconds since a Kubernetes time stamp (0 when there is none or it does not parse)."""
    if not stamp:
        return 0.0
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def _graph_lost(job_status: Mapping[str, Any]) -> bool:
    """Whether a build Job succeeded long enough ago (the cache's lag) that its ConfigMap should
    be cached, and is not."""
    if not job_status.get("succeeded"):
        return False
    return _age_s(job_status.get("completionTime")) > CACHE_LAG_S


async def _leave_other_builds(cluster: Cluster, app: render.AppView, name: str) -> None:
    """Once per build an application settles on (in this process): no longer own the builds it
    used before (an old build of changed inputs, or a per-application build of an earlier
    version of the operator), so each is collected with its last user. A shared graph ConfigMap
    that nobody owns and whose Job is gone (its users all deleted before they owned it) goes
    too."""
    key = f"ServeApplication/{app.namespace}/{app.cr_name}"
    if cluster.builds.get(key) == name:
        return
    for kind in ("Job", "ConfigMap"):
        for obj in cluster.cache.objects(kind, app.namespace, _BUILD_SELECTOR):
            other = obj["metadata"]["name"]
            if other == name:
                continue
            await cluster.drop_owner(kind, obj, app.uid, key)
            meta = obj["metadata"]
            shared = not (meta.get("labels") or {}).get(contract.APPLICATION_LABEL)
            orphan = shared and not meta.get("ownerReferences")
            if (
                kind == "ConfigMap"
                and orphan
                and cluster.cache.get("Job", app.namespace, other) is None
            ):
                await cluster.kube.delete(kind, app.namespace, other)
    cluster.builds[key] = name


_BUILD_SELECTOR = {contract.COMPONENT_LABEL: contract.COMPONENT_BUILD}


def _build_note(cluster: Cluster, app: render.AppView, instance: render.InstanceView) -> str:
    """What the build Job's pod is doing when it installs the runtime_env's packages."""
    job_name = render.build_name(instance, app)
    for pod in cluster.cache.objects("Pod", app.namespace, {"job-name": job_name}):
        for init in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if "running" in (init.get("state") or {}) and asks_for_packages(app.runtime_env):
                name = pod["metadata"]["name"]
                return f"installing the runtime_env's packages in the build pod {name}"
    return ""


def _scale_reason(decision: dict[str, Any] | None, external: bool) -> str:
    """Why a deployment's replica count changed, for its ``Scaled`` Event."""
    if decision is not None:
        return str(decision["reason"])
    if external:
        return "set by the external scaler"
    return "the application's config (num_replicas or target_capacity)"
