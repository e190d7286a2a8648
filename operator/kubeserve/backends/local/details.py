"""GET /api/serve/applications/ of the local backend: Ray 2.60's ServeInstanceDetails.

Pure formatting of what the controller observes; every value comes from its state objects.
"""

from __future__ import annotations

import os
from typing import Any

from kubeserve.backends.local.application_state import ApplicationState
from kubeserve.backends.local.controller import Controller
from kubeserve.backends.local.deployment_state import DeploymentState
from kubeserve.backends.local.store import DesiredState, StoredApp
from kubeserve.control import config as config_rules
from kubeserve.control.status import DeploymentStatusInfo

_HOST_IP = "127.0.0.1"


def instance_details(controller: Controller, desired: DesiredState | None) -> dict[str, Any]:
    """``desired`` is read fresh from the store, so an accepted PUT shows at once."""
    if desired is None and not controller.apps:
        return {"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None}
    options = desired.options if desired is not None else {}
    node_id = controller.node_id
    body: dict[str, Any] = {
        "controller_info": {
            "node_id": node_id,
            "node_ip": _HOST_IP,
            "actor_id": f"controller-{os.getpid()}",
            "actor_name": "SERVE_CONTROLLER_ACTOR",
            "worker_id": str(os.getpid()),
            "log_file_path": str(controller.settings.log_dir / "controller.log"),
        },
        "proxy_location": options.get("proxy_location", "EveryNode"),
        "http_options": options.get("http_options", {}),
        "grpc_options": options.get("grpc_options", {}),
        "proxies": _proxies(controller, node_id),
        "applications": _applications(controller, desired, node_id),
        "target_capacity": options.get("target_capacity"),
    }
    return body


def _applications(
    controller: Controller, desired: DesiredState | None, node_id: str
) -> dict[str, Any]:
    """Each application as the controller sees it, unless the store already says otherwise.

    The controller acts on the store at its next pass; until then the store wins: an application
    the store no longer has is ``DELETING``, and one created again under the same name (another
    ``uid``) or changed is reported from its new config, never from the previous incarnation.
    """
    stored = {app.name: app for app in desired.applications} if desired is not None else {}
    apps: dict[str, Any] = {}
    for name, app in controller.apps.items():
        body = _application(app, node_id)
        if name not in stored or stored[name].uid != app.uid:
            body["status"], body["message"] = "DELETING", ""
        apps[name] = body
    for name, wanted in stored.items():
        known = controller.apps.get(name)
        if (
            known is None
            or known.uid != wanted.uid
            or known.config != wanted.config
            or known.deployed_at != wanted.deployed_at
        ):
            apps[name] = _accepted(wanted)
    return apps


def _accepted(stored: StoredApp) -> dict[str, Any]:
    """An application the store holds that the controller has not picked up yet."""
    return {
        "name": stored.name,
        "route_prefix": stored.config.get("route_prefix", "/"),
        "docs_path": None,
        "status": "DEPLOYING",
        "message": "",
        "last_deployed_time_s": stored.deployed_at,
        "deployed_app_config": stored.config,
        "source": "declarative",
        "deployments": {},
        "external_scaler_enabled": bool(stored.config.get("external_scaler_enabled", False)),
    }


def _proxies(controller: Controller, node_id: str) -> dict[str, Any]:
    proxy = controller.proxy
    if proxy is None:
        return {}
    return {
        node_id: {
            "node_id": node_id,
            "node_ip": _HOST_IP,
            "actor_id": f"proxy-{proxy.pid}",
            "actor_name": f"SERVE_PROXY_ACTOR-{node_id}",
            "worker_id": str(proxy.pid),
            "log_file_path": str(proxy.log_path),
            "status": proxy.status,
        }
    }


def _application(app: ApplicationState, node_id: str) -> dict[str, Any]:
    status = app.status()
    deployments = {
        name: _deployment(state, status.deployments.get(name), node_id)
        for name, state in app.deployments.items()
        if state.config
    }
    body: dict[str, Any] = {
        "name": app.name,
        "route_prefix": app.route_prefix,
        "docs_path": None,
        "status": status.status,
        "message": status.message,
        "last_deployed_time_s": app.deployed_at,
        "deployed_app_config": app.config,
        "source": "declarative",
        "deployments": deployments,
        "external_scaler_enabled": bool(app.config.get("external_scaler_enabled", False)),
    }
    if app.graph is not None:
        body["deployment_topology"] = _topology(app)
    return body


def _topology(app: ApplicationState) -> dict[str, Any]:
    assert app.graph is not None
    nodes = {
        node["name"]: {
            "name": node["name"],
            "app_name": app.name,
            "outbound_deployments": [
                {"name": target, "app_name": app.name} for target in node.get("outbound", [])
            ],
            "is_ingress": bool(node.get("is_ingress")),
        }
        for node in app.graph["deployments"]
    }
    return {"app_name": app.name, "nodes": nodes, "ingress_deployment": app.graph["ingress"]}


def _deployment(
    state: DeploymentState, info: DeploymentStatusInfo | None, node_id: str
) -> dict[str, Any]:
    status = info or DeploymentStatusInfo("UPDATING", "CONFIG_UPDATE_STARTED")
    return {
        "name": state.name,
        "status": status.status,
        "status_trigger": status.status_trigger,
        "message": status.message,
        "deployment_config": state.config,
        "target_num_replicas": state.target,
        "required_resources": config_rules.required_resources(state.config),
        "replicas": [
            {
                "node_id": node_id,
                "node_ip": _HOST_IP,
                "actor_id": replica.replica_id,
                "actor_name": f"SERVE_REPLICA::{state.app}#{state.name}#{replica.replica_id}",
                "worker_id": str(replica.pid or ""),
                "log_file_path": str(replica.log_path),
                "replica_id": replica.replica_id,
                "state": replica.state,
                "pid": replica.pid,
                "start_time_s": replica.start_time_s,
            }
            for replica in state.replicas.values()
        ],
    }
