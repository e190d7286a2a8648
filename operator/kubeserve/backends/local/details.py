"""What the local controller observes, as the backend-neutral views of GET /api/serve/applications/.

:func:`kubeserve.control.details.instance_details` builds Ray 2.60's ServeInstanceDetails from
them; this module only reads the controller's state objects and the store. Every process runs on
this machine: one node, the controller's.
"""

from __future__ import annotations

import dataclasses
import os

from kubeserve.backends.local.application_state import ApplicationState
from kubeserve.backends.local.controller import Controller
from kubeserve.backends.local.deployment_state import ROLLOUT, DeploymentState
from kubeserve.backends.local.replica_process import ReplicaProcess
from kubeserve.backends.local.store import DesiredState, StoredApp
from kubeserve.backends.process_health import controller_health
from kubeserve.control.details import (
    ApplicationDetailsView,
    DeploymentDetailsView,
    InstanceDetailsView,
    ProcessView,
    ProxyView,
    ReplicaProcessView,
    controller_process,
)
from kubeserve.control.status_derivation import DerivedDeploymentStatus

_HOST_IP = "127.0.0.1"


def instance_view(
    controller: Controller, desired: DesiredState | None
) -> InstanceDetailsView | None:
    """``desired`` is read fresh from the store, so an accepted PUT shows at once; ``None`` when
    nothing runs."""
    if desired is None and not controller.apps:
        return None
    node_id = controller.node_id
    log_path = controller.settings.controller_log
    return InstanceDetailsView(
        controller=controller_process(node_id, _HOST_IP, os.getpid(), str(log_path)),
        options=desired.options if desired is not None else {},
        proxies=_proxies(controller, node_id),
        applications=_applications(controller, desired, node_id),
        health=controller_health(controller.started_at),
        rollout=ROLLOUT,
    )


def _applications(
    controller: Controller, desired: DesiredState | None, node_id: str
) -> list[ApplicationDetailsView]:
    """Each application as the controller sees it, unless the store already says otherwise.

    The controller acts on the store at its next pass; until then the store wins: an application
    the store no longer has is ``DELETING``, and one created again under the same name (another
    ``uid``) or changed is reported from its new config, never from the previous incarnation.
    """
    stored = {app.name: app for app in desired.applications} if desired is not None else {}
    apps: dict[str, ApplicationDetailsView] = {}
    for name, app in controller.apps.items():
        view = _application(app, node_id)
        if name not in stored or stored[name].uid != app.uid:
            view = dataclasses.replace(view, status="DELETING", message="")
        apps[name] = view
    for name, wanted in stored.items():
        known = controller.apps.get(name)
        if (
            known is None
            or known.uid != wanted.uid
            or known.config != wanted.config
            or known.deployed_at != wanted.deployed_at
        ):
            apps[name] = _accepted(wanted)
    return list(apps.values())


def _accepted(stored: StoredApp) -> ApplicationDetailsView:
    """An application the store holds that the controller has not picked up yet."""
    return ApplicationDetailsView(
        name=stored.name,
        route_prefix=stored.config.get("route_prefix", "/"),
        status="DEPLOYING",
        message="",
        deployed_at=stored.deployed_at,
        config=stored.config,
        api_type=stored.api_type,
    )


def _proxies(controller: Controller, node_id: str) -> dict[str, ProxyView]:
    proxy = controller.proxy
    if proxy is None:
        return {}
    process = ProcessView(
        node_id, _HOST_IP, f"proxy-{proxy.pid}", str(proxy.pid), str(proxy.log_path)
    )
    return {node_id: ProxyView(process, proxy.status)}


def _application(app: ApplicationState, node_id: str) -> ApplicationDetailsView:
    status = app.status()
    return ApplicationDetailsView(
        name=app.name,
        route_prefix=app.route_prefix,
        status=status.status,
        message=status.message,
        deployed_at=app.deployed_at,
        config=app.config,
        deployments=[
            _deployment(state, node_id, status.deployments.get(name))
            for name, state in app.deployments.items()
            if state.has_target
        ],
        graph=app.graph,
        docs_path=(app.serving_graph or {}).get("docs_path"),
        api_type=app.api_type,
    )


def _deployment(
    state: DeploymentState, node_id: str, info: DerivedDeploymentStatus | None
) -> DeploymentDetailsView:
    def replica(replica: ReplicaProcess, dead: bool = False) -> ReplicaProcessView:
        return ReplicaProcessView(
            ProcessView(
                node_id,
                _HOST_IP,
                replica.replica_id,
                str(replica.pid or ""),
                str(replica.log_path),
            ),
            replica_id=replica.replica_id,
            state="STOPPED" if dead else replica.state,
            pid=replica.pid,
            start_time_s=replica.start_time_s,
        )

    scaler = state.scaling.autoscaler
    autoscaling = None if scaler is None else scaler.detail(len(state.running_replicas()))
    view = DeploymentDetailsView(
        state.name,
        state.config,
        state.target,
        [replica(r) for r in state.replicas.values()],
        autoscaling=autoscaling,
        recent_dead_replicas=[replica(r, dead=True) for r in state.dead_replicas],
    )
    if info is None:
        return view
    return dataclasses.replace(
        view, status=info.status, status_trigger=info.status_trigger, message=info.message
    )
