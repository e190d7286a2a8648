"""Rendering: custom resources -> the Kubernetes objects that run them. Pure, no I/O.

Every function maps frozen views (:mod:`.render_views`) to manifest dicts ready for server-side
apply; equal views render equal manifests, so the operator can compare before writing. Names,
labels and ownerReferences follow the contract of :mod:`kubeserve.backends.kubernetes` (spelled
in :mod:`kubeserve.runtime.kubernetes.contract`); pod conventions (environment, runtime_env,
security) are in :mod:`.render_pod`; proxies and RBAC in :mod:`.render_proxy`.

Per serve deployment (:func:`render_replica_workload`, :func:`render_replica_service`): the pod
template depends only on the instance image, the application's import path and runtime_env, and the
deployment's process options, health checks and shutdown timeouts. ``user_config`` and replica
counts are never in it (they change without a restart), and one deployment's objects do not
depend on any other deployment's config, so a change rolls only the deployment it concerns.

A replica runs ``kubeserve replica --host $(KUBESERVE_BIND_HOST) --port 8000`` with:

* ``KUBESERVE_REPLICA_CONFIG``: the :class:`kubeserve.runtime.wire.ReplicaConfig` JSON with
  ``replica_id`` = the pod name (``$(KUBESERVE_POD_NAME)``) and ``user_config`` null: the replica
  reads its ``user_config`` from the ``ServeApplication`` named by ``KUBESERVE_APPLICATION`` before
  it reports healthy, and the operator pushes later changes to ``POST /-/reconfigure``;
* ``KUBESERVE_APPLICATION`` (the application object's name), ``KUBESERVE_INSTANCE``, and
  ``KUBESERVE_DISCOVERY=kubernetes`` (handles discover replicas as proxies do, in
  ``KUBESERVE_NAMESPACE``).

Every connection to port 8000 must pass the data-plane handshake
(:mod:`kubeserve.runtime.channel`; the secret comes from the instance's Secret as
``KUBESERVE_DATA_PLANE_SECRET``), which a kubelet cannot do. So the replica runs the user's
``check_health`` itself every ``health_check_period_s`` (limited to ``health_check_timeout_s``) and
reports the last result on an unauthenticated listener, container port ``probe`` (8081), that
answers only ``GET /-/healthz`` and never runs user code (:mod:`kubeserve.runtime.replica.probe`).
Probes point there: readiness every ``health_check_period_s`` (out of rotation on the first
failure), liveness likewise (restart after 3 failures, as Ray replaces a replica after 3), and a
startup probe that gives the constructor up to :data:`~.render_pod.STARTUP_TIMEOUT_S` seconds.
``graceful_shutdown_timeout_s`` becomes ``terminationGracePeriodSeconds`` (plus the
:data:`~kubeserve.runtime.kubernetes.contract.REPLICA_LEAVE_DELAY_S` a signalled replica keeps
serving while proxies learn that it leaves, and a second for them to drop its connections).
Rollouts follow Ray's ``rolling_update_percentage`` and ``max_surge_percent``
(:mod:`kubeserve.control.rollout`), as the Deployment's ``maxUnavailable`` and ``maxSurge``; by
default no surge, at most 20% of the replicas replaced at a time (at least one), so a rollout
never needs room for extra GPUs. A PodDisruptionBudget (:func:`render_replica_disruption_budget`)
holds voluntary evictions (``kubectl drain``, a cluster autoscaler) to the same bound: a drain
never takes every replica of a deployment at once, and never blocks on one.

An application deployed with ``serve.run`` has no import path: its pickled graph is in the Secret
:func:`~kubeserve.runtime.kubernetes.contract.pickled_graph_secret_name` (written by the admin
API, owned by the ``ServeApplication``), mounted read-only into its build and replica pods at
:data:`PICKLED_GRAPH_FILE`; the build runs ``kubeserve build --pickled-file <that file>`` and the
replica config carries ``app_graph_file``. A mounted Secret rather than a fetch from the operator:
the kubelet delivers it with the node's credentials (the pods need no read access to Secrets and
no new path to the operator), and a replica restarted while the operator is down still starts.

One build per distinct build input (:func:`render_build_job`): the Job
:func:`~.render_views.build_name` (``<inst>-build-<digest of what the build reads>``) runs
``kubeserve build <import_path> --configmap <that name> --namespace $(KUBESERVE_NAMESPACE)`` in
the application's image and runtime_env, with ``--tracing-config <json>`` when the instance
traces (the digest covers it: a changed ``tracingConfig`` checks its exporter again). The build
writes the ConfigMap of the same name with the key ``graph.json`` holding its JSON document (the
graph, or ``{"error": ...}``), then exits 0 on success and 1 on a build error. A thousand
applications of one image and module build once: each of them is an owner of the Job (while it
runs) and of the ConfigMap, so either is collected when no application uses it any more.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kubeserve.backends.kubernetes.render_pod import (
    STARTUP_TIMEOUT_S,
    Manifest,
    container,
    data_plane_secret_env,
    escape,
    image_for,
    node_scheduling,
    per_node_cap,
    resources,
    seconds,
    user_pod_spec,
    with_access_log_file,
    with_node_sockets,
)
from kubeserve.backends.kubernetes.render_proxy import (
    render_data_plane_secret,
    render_dataplane_rbac,
    render_metrics_token_secret,
    render_network_policies,
    render_proxy,
)
from kubeserve.backends.kubernetes.render_views import (
    AppView,
    DesiredDeployment,
    InstanceView,
    RenderError,
    app_view,
    build_name,
    deployment_view,
    instance_view,
    own_graph_name,
)
from kubeserve.control import rollout
from kubeserve.control.effective_config import HEALTH_CHECK_FAILURE_THRESHOLD, EffectiveDeployment
from kubeserve.runtime import wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.contract import (
    APPLICATION_ENV,
    BIND_HOST_ENV,
    DISCOVERY_ENV,
    DISCOVERY_KUBERNETES,
    INSTANCE_ENV,
    NAMESPACE_ENV,
    POD_NAME_ENV,
    POLICY_PORT,
    PROBE_PORT,
    REPLICA_PORT,
)
from kubeserve.runtime.runtime_env import merge_runtime_env

__all__ = [
    "BUILD_DEADLINE_S",
    "BUILD_TTL_S",
    "PICKLED_GRAPH_FILE",
    "ROLLOUT",
    "AppView",
    "DesiredDeployment",
    "InstanceView",
    "Manifest",
    "RenderError",
    "app_view",
    "build_name",
    "deployment_view",
    "instance_view",
    "own_graph_name",
    "render_build_job",
    "render_data_plane_secret",
    "render_dataplane_rbac",
    "render_instance_network_policies",
    "render_metrics_token_secret",
    "render_network_policies",
    "render_policy_workload",
    "render_proxy",
    "render_replica_disruption_budget",
    "render_replica_service",
    "render_replica_workload",
    "replica_config_json",
]

#: A serve deployment's Deployment replaces pods as Ray's defaults replace replicas, unless its
#: config sets ``rolling_update_percentage`` or ``max_surge_percent``: a fifth of them at a time
#: (``maxUnavailable``), no extra pod meanwhile (``maxSurge``).
ROLLOUT = rollout.RAY_DEFAULT

#: A finished build Job (and its pod, with the logs) is kept this long; the graph lives on in the
#: ConfigMap.
BUILD_TTL_S = 3600
#: Image pull, runtime_env fetch and import together must finish within this.
BUILD_DEADLINE_S = 900
_BUILD_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}}
_POLICY_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}}
_STARTUP_PERIOD_S = 2
#: An imperative application's pickled graph in its build and replica pods (the mounted Secret).
PICKLED_GRAPH_FILE = f"{contract.PICKLED_GRAPH_DIR}/{contract.PICKLED_GRAPH_KEY}"


def _metadata(
    name: str, namespace: str, labels: dict[str, str], owner: dict[str, str], **annotations: str
) -> Manifest:
    meta: Manifest = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    meta["ownerReferences"] = [contract.owner_reference(owner)]
    return meta


def _name_annotations(app: AppView, deployment: DesiredDeployment) -> dict[str, str]:
    return {
        contract.APPLICATION_NAME_ANNOTATION: app.app_name,
        contract.DEPLOYMENT_NAME_ANNOTATION: deployment.name,
    }


# --------------------------------------------------------------------------- replicas


def replica_config_json(
    app: AppView,
    deployment: DesiredDeployment,
    http_root_path: str = "",
    tracing_config: dict[str, Any] | None = None,
) -> str:
    """The ``KUBESERVE_REPLICA_CONFIG`` value: literal except ``replica_id``, the pod's name;
    ``http_root_path`` is the instance's ``httpOptions.rootPath``, ``tracing_config`` its
    ``tracingConfig`` when that enables tracing."""
    config = deployment.config
    replica: wire.ReplicaConfig = {
        "app": app.app_name,
        "deployment": deployment.name,
        "import_path": str(app.config.get("import_path", "")),
        "replica_id": "",
        "user_config": None,
        "max_ongoing_requests": config.max_ongoing_requests,
        "graceful_shutdown_wait_loop_s": config.graceful_shutdown_wait_loop_s,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "probe_port": PROBE_PORT,
        "leave_delay_s": contract.REPLICA_LEAVE_DELAY_S,
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
    }
    if app.config.get("args"):
        replica["app_args"] = dict(app.config["args"])
    if app.graph_secret is not None:
        replica["app_graph_file"] = PICKLED_GRAPH_FILE
    if config.logging_config:
        replica["logging_config"] = dict(config.logging_config)
    if (router := wire.request_router_spec(config)) is not None:
        replica["request_router_class"] = router["request_router_class"]
    route_prefix = app.config.get("route_prefix")
    if route_prefix and route_prefix != "/":  # an ASGI ingress sees it as root_path
        replica["route_prefix"] = str(route_prefix)
    if http_root_path:
        replica["http_root_path"] = http_root_path
    if tracing_config:
        replica["tracing_config"] = tracing_config
    rest = {k: v for k, v in replica.items() if k != "replica_id"}
    literal = escape(json.dumps(rest, sort_keys=True, separators=(",", ":")))
    return f'{{"replica_id":"$({POD_NAME_ENV})",{literal[1:]}'


def _replica_probes(config: EffectiveDeployment) -> Manifest:
    check: Manifest = {
        "httpGet": {"path": wire.HEALTHZ_PATH, "port": "probe"},
        "periodSeconds": seconds(config.health_check_period_s),
        "timeoutSeconds": seconds(config.health_check_timeout_s),
    }
    startup = {
        **check,
        "periodSeconds": _STARTUP_PERIOD_S,
        "failureThreshold": math.ceil(STARTUP_TIMEOUT_S / _STARTUP_PERIOD_S),
    }
    return {
        "startupProbe": startup,
        "readinessProbe": {**check, "failureThreshold": 1},
        "livenessProbe": {**check, "failureThreshold": HEALTH_CHECK_FAILURE_THRESHOLD},
    }


def _replica_pod(instance: InstanceView, app: AppView, deployment: DesiredDeployment) -> Manifest:
    options = deployment.actor_options
    runtime_env = merge_runtime_env(app.runtime_env, options.get("runtime_env"))
    field = f"runtime_env of deployment {deployment.name!r}"
    image = image_for(runtime_env, instance.image, field)
    command = [
        "kubeserve",
        "replica",
        "--host",
        f"$({BIND_HOST_ENV})",
        "--port",
        str(REPLICA_PORT),
    ]
    main = container("replica", image, instance.image_pull_policy, command, [])
    main |= {
        "ports": [
            {"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"},
            {"name": "probe", "containerPort": PROBE_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": contract.METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources(options),
        **_replica_probes(deployment.config),
    }
    own_env = {
        wire.REPLICA_CONFIG_ENV: replica_config_json(
            app, deployment, str(instance.http_options.root_path or ""), instance.tracing_config
        ),
        APPLICATION_ENV: app.cr_name,
        INSTANCE_ENV: instance.name,
        DISCOVERY_ENV: DISCOVERY_KUBERNETES,
        contract.METRICS_PORT_ENV: str(contract.METRICS_PORT),
    }
    if instance.report_url:  # handle calls waiting for replicas are reported to the operator
        own_env[wire.CONTROLLER_URL_ENV] = instance.report_url
    grace_s = deployment.config.graceful_shutdown_timeout_s + contract.REPLICA_GRACE_EXTRA_S
    fields: Manifest = {"terminationGracePeriodSeconds": math.ceil(grace_s)}
    fields |= node_scheduling(options)
    _, _, selector = _replica_identity(instance, app, deployment)
    fields |= per_node_cap(deployment.config.max_replicas_per_node, selector)
    account = contract.dataplane_account_name(instance.name)
    refs = [data_plane_secret_env(instance.name)]
    spec = user_pod_spec(
        main,
        runtime_env,
        own_env,
        account,
        field=field,
        refs=refs,
        secret_mount=_graph_mount(app),
        **fields,
    )
    if instance.node_local_sockets:
        spec = with_node_sockets(spec, instance.namespace, instance.name, owner=True)
    if instance.access_lines_to_file:
        spec = with_access_log_file(spec)
    return spec


def _replica_identity(
    instance: InstanceView, app: AppView, deployment: DesiredDeployment
) -> tuple[str, dict[str, str], dict[str, str]]:
    """Name, labels and pod selector shared by a deployment's workload and Service."""
    name = contract.workload_name(app.cr_name, deployment.name)
    component = contract.COMPONENT_REPLICA
    labels = contract.common_labels(component, instance.name, app.cr_name, deployment.name)
    selector = contract.selector_labels(
        component, application=app.cr_name, deployment=deployment.name
    )
    return name, labels, selector


def render_replica_workload(
    instance: InstanceView, app: AppView, deployment: DesiredDeployment
) -> Manifest:
    """The Deployment (DaemonSet when ``is_driver_deployment``) running the replicas."""
    name, labels, selector = _replica_identity(instance, app, deployment)
    version = {contract.VERSION_ANNOTATION: deployment.version}
    template = {
        "metadata": {"labels": labels, "annotations": {**version, **contract.SCRAPE_ANNOTATIONS}},
        "spec": _replica_pod(instance, app, deployment),
    }
    spec: Manifest = {
        "selector": {"matchLabels": selector},
        "template": template,
        "revisionHistoryLimit": 3,
    }
    if deployment.config.is_driver_deployment:
        kind = "DaemonSet"
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    else:
        kind = "Deployment"
        spec["replicas"] = deployment.target_replicas
        # Absolute counts, as Ray rounds them (a percentage would round maxUnavailable down to 0)
        surge, unavailable = deployment.config.rollout(ROLLOUT).bounds(deployment.target_replicas)
        rolling = {"maxSurge": surge, "maxUnavailable": unavailable}
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": rolling}
    annotations = {**_name_annotations(app, deployment), **version}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _metadata(name, app.namespace, labels, app.owner(), **annotations),
        "spec": spec,
    }


def render_replica_disruption_budget(
    instance: InstanceView, app: AppView, deployment: DesiredDeployment
) -> Manifest | None:
    """The PodDisruptionBudget of a deployment's replicas: evictions take at most as many at a
    time as its roll replaces (``maxUnavailable``, at least one, so that a drain proceeds even
    with one replica or a surge-only roll), and a pod that is not Ready never holds a drain up
    (``unhealthyPodEvictionPolicy: AlwaysAllow``). None for a DaemonSet (a driver deployment):
    its pods follow their nodes, and a budget cannot count them by ``maxUnavailable``. None too
    when ``maxUnavailable`` is at least the replica count (one replica, or none): such a budget
    never refuses an eviction, and it was one object, one write and the disruption controller's
    status writes per deployment for nothing (two of the three deployments of a typical
    application; a pass prunes the budget when the count falls, and applies it when it rises)."""
    if deployment.config.is_driver_deployment:
        return None
    _, unavailable = deployment.config.rollout(ROLLOUT).bounds(deployment.target_replicas)
    if max(1, unavailable) >= deployment.target_replicas:
        return None
    name, labels, selector = _replica_identity(instance, app, deployment)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(
            name, app.namespace, labels, app.owner(), **_name_annotations(app, deployment)
        ),
        "spec": {
            "selector": {"matchLabels": selector},
            "maxUnavailable": max(1, unavailable),
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_replica_service(
    instance: InstanceView, app: AppView, deployment: DesiredDeployment
) -> Manifest:
    """The headless Service whose EndpointSlices list the deployment's ready replicas."""
    name, labels, selector = _replica_identity(instance, app, deployment)
    annotations = _name_annotations(app, deployment)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, app.namespace, labels, app.owner(), **annotations),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": selector,
            "ports": [
                {
                    "name": "http",
                    "port": REPLICA_PORT,
                    "targetPort": REPLICA_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_instance_network_policies(
    instance: InstanceView, operator_namespace: str
) -> list[Manifest]:
    """:func:`~.render_proxy.render_network_policies` with the replica's and policy host's
    ports."""
    return render_network_policies(
        instance, operator_namespace, REPLICA_PORT, PROBE_PORT, POLICY_PORT
    )


# --------------------------------------------------------------------------- builds


def _graph_mount(app: AppView) -> tuple[str, str] | None:
    """An imperative application's graph Secret, mounted where :data:`PICKLED_GRAPH_FILE` is."""
    secret = app.graph_secret
    return None if secret is None else (secret, contract.PICKLED_GRAPH_DIR)


def _builder_args(app: AppView) -> list[str]:
    args = app.config.get("args")
    return ["--args", escape(json.dumps(args, sort_keys=True))] if args else []


def _build_command(app: AppView, name: str) -> list[str]:
    """``kubeserve build``'s command, writing the ConfigMap ``name``; with the instance's
    ``tracing_config`` (tracing on, part of the build key) the build also checks that its
    exporter imports where the application runs (a BuildError otherwise). Nothing in it names
    the application: every application with the same inputs shares it."""
    tracing_config = app.tracing_config
    tracing = ["--tracing-config", escape(json.dumps(tracing_config, sort_keys=True))]
    if app.graph_secret is not None:
        code = ["--pickled-file", PICKLED_GRAPH_FILE]
    else:
        code = [escape(str(app.config["import_path"]))]
    return [
        "kubeserve",
        "build",
        *code,
        "--configmap",
        name,
        "--namespace",
        f"$({NAMESPACE_ENV})",
        *_builder_args(app),
        *(tracing if tracing_config else []),
    ]


def render_build_job(instance: InstanceView, app: AppView) -> Manifest:
    """The Job that imports the application and writes its graph, named :func:`build_name`:
    one per distinct build input, shared by every application with those inputs.

    Owned (not controlled) by ``app``, the application that needs it first; the others that
    use it add themselves as owners (:meth:`~.cluster.Cluster.add_owner`), so it is collected
    when none is left. Neither it nor its pod carries the application's label or name."""
    image = image_for(app.runtime_env, instance.image, "runtime_env")
    name = build_name(instance, app)
    command = _build_command(app, name)
    main = container("build", image, instance.image_pull_policy, command, [])
    main["resources"] = _BUILD_RESOURCES
    own_env = {INSTANCE_ENV: instance.name}
    account = contract.build_account_name(instance.name)
    pod = user_pod_spec(
        main,
        app.runtime_env,
        own_env,
        account,
        field="runtime_env",
        secret_mount=_graph_mount(app),
        restartPolicy="Never",
    )
    labels = contract.common_labels(contract.COMPONENT_BUILD, instance.name)
    owner = contract.owner_reference(app.owner(), controller=False, block_owner_deletion=False)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": app.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": BUILD_TTL_S,
            "activeDeadlineSeconds": BUILD_DEADLINE_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


# --------------------------------------------------------------------------- policy host


def render_policy_workload(instance: InstanceView, app: AppView) -> Manifest:
    """The Deployment of one pod answering the application's custom autoscaling policies.

    Only for applications with a custom policy (the operator prunes it otherwise). It runs
    ``kubeserve policy-host`` (:mod:`kubeserve.runtime.policy_server`) in the application's image
    and runtime_env, with its code as the build gets it (import path and ``args``, or the
    mounted pickled graph), behind the data-plane handshake with the pod's name as identity, as
    a replica. Its template depends on :attr:`~.render_views.AppView.code_key` (the
    annotation): new code restarts it, which loses ``policy_state`` as Ray's controller restart
    does. ``Recreate``: never two hosts, so one policy state at a time. The pod needs no
    Kubernetes API: no token is mounted.
    """
    image = image_for(app.runtime_env, instance.image, "runtime_env")
    if app.graph_secret is not None:
        code = ["--pickled-file", PICKLED_GRAPH_FILE]
    else:
        code = ["--import-path", escape(str(app.config["import_path"]))]
    command = [
        "kubeserve",
        "policy-host",
        escape(app.app_name),
        *code,
        *_builder_args(app),
        "--host",
        f"$({BIND_HOST_ENV})",
        "--port",
        str(POLICY_PORT),
        "--identity",
        f"$({POD_NAME_ENV})",
    ]
    main = container("policy-host", image, instance.image_pull_policy, command, [])
    main |= {
        "ports": [{"name": "policy", "containerPort": POLICY_PORT, "protocol": "TCP"}],
        "resources": _POLICY_RESOURCES,
    }
    own_env = {APPLICATION_ENV: app.cr_name, INSTANCE_ENV: instance.name}
    pod = user_pod_spec(
        main,
        app.runtime_env,
        own_env,
        contract.dataplane_account_name(instance.name),
        field="runtime_env",
        refs=[data_plane_secret_env(instance.name)],
        secret_mount=_graph_mount(app),
        automountServiceAccountToken=False,
    )
    component = contract.COMPONENT_POLICY
    labels = contract.common_labels(component, instance.name, app.cr_name)
    selector = contract.selector_labels(component, application=app.cr_name)
    version = {contract.VERSION_ANNOTATION: app.code_key}
    name = contract.policy_workload_name(app.cr_name)
    annotations = {contract.APPLICATION_NAME_ANNOTATION: app.app_name, **version}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, app.namespace, labels, app.owner(), **annotations),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": labels, "annotations": version},
                "spec": pod,
            },
        },
    }
