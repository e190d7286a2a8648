"""Which of Ray Serve 2.60's config fields (and decorator options) kubeserve acts on, and why it
refuses the others.

Every field of Ray's ``ServeDeploySchema`` (and of the models it contains) has exactly one entry
in :data:`SUPPORT`, keyed ``"RayModelName.field"``, and so has every option of Ray's
``@serve.deployment`` that no config has (keyed ``"serve.deployment.option"``): the REST API, the
custom resources and the decorator give one answer, in the same words. A test walks Ray's
published schema and fails for a field without an entry, so a new Ray field cannot slip in
unnoticed, and the README's field table is generated from this one
(``python -m kubeserve.schema.support``).

- ``works``: acted on as Ray documents it, on both backends.
- ``partial``: acted on, with the gap the note states (the README repeats it).
- ``inert``: accepted, and has no effect in Ray either unless a refused field is also given
  (e.g. ``grpc_options.port`` without servicer functions: Ray starts no gRPC server).
- ``refused``: any value other than those in ``accepts`` (the values that ask for nothing, such
  as Ray's default, which tools like ``serve build`` write out) is a 400 at the field's JSON path
  with the note as the reason. Nothing is accepted, echoed back by GET and then ignored.

The check itself is :func:`refusal`, called by every REST model's validator for the fields the
client gave (``model_fields_set``), so the single-application body, the multi-application body and
the custom resources (validated through the same models) all refuse alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

Status = Literal["works", "partial", "inert", "refused"]


@dataclass(frozen=True)
class Support:
    status: Status
    note: str = ""
    #: for ``refused``: the values that ask for nothing and are therefore accepted
    accepts: tuple[Any, ...] = (None,)


def works(note: str = "") -> Support:
    return Support("works", note)


def partial(note: str) -> Support:
    return Support("partial", note)


def inert(note: str) -> Support:
    return Support("inert", note)


def refused(reason: str, *accepts: Any) -> Support:
    return Support("refused", reason, accepts or (None,))


_TLS_ON_KUBERNETES = (
    "; on Kubernetes the same from a Secret (tls.crt, tls.key, ca.crt, as cert-manager writes "
    "it) named in the ServeInstance's spec.tls, and the paths are refused (400): a renewed "
    "Secret reaches new handshakes without failing a request, and one that does not load is "
    "InvalidTLS in the instance's status while the proxies serving go on"
)
_TLS = {
    "ssl_keyfile": works(
        "kubeserve start: the proxy serves HTTPS; the files are checked at PUT (unreadable, a "
        "key not the certificate's, an expired certificate: 400 at the field) and reloaded when "
        "they change, without dropping connections" + _TLS_ON_KUBERNETES
    ),
    "ssl_certfile": works("kubeserve start: see ssl_keyfile" + _TLS_ON_KUBERNETES),
    "ssl_keyfile_password": partial(
        "kubeserve start: decrypts ssl_keyfile (given to the proxy in its environment, never "
        "its command line); on Kubernetes refused (400): a kubernetes.io/tls Secret's tls.key "
        "is not encrypted"
    ),
    "ssl_ca_certs": works(
        "kubeserve start: clients must present a certificate this CA signed (Ray's uvicorn only "
        "asks for one); on Kubernetes the Secret's ca.crt with spec.tls."
        "requireClientCertificates, and the path is refused (400)"
    ),
}
_PLACEMENT_GROUPS = refused(
    "placement groups are a Ray cluster scheduling feature kubeserve does not have; give each "
    "replica's resources in ray_actor_options instead"
)
_RUNTIME_ENV_PACKAGES = (
    "switching interpreters or container runtimes per application is not supported: use pip or "
    "uv for packages, or build an image (Kubernetes) or a virtualenv (kubeserve start)"
)

_LOGGING = {
    "encoding": works(
        "TEXT (Ray's line format) or JSON (Ray's keys) for replicas; the top level sets the "
        "proxy's (kubeserve start)"
    ),
    "log_level": works("the level of the replica's (or proxy's) loggers, the user's included"),
    "logs_dir": refused(
        "logs are written under the state directory (kubeserve start) or to the container's "
        "output (Kubernetes); another directory is not supported"
    ),
    "enable_access_log": works("an access line per request at proxies and replicas"),
    "additional_log_standard_attrs": works("standard record attributes added to each line"),
}

_RUNTIME_ENV = {
    "working_dir": works("zip archives over http(s); fetched once into a cache"),
    "py_modules": works("zip archives over http(s); fetched once into a cache"),
    "env_vars": works("application-level, overridden per deployment"),
    "pip": works(
        "a list, a requirements file in the working_dir, or the dict form (pip_check, "
        "pip_version, pip_install_options); installed with uv into an environment per distinct "
        "spec, layered on the replica's interpreter and shared by every replica and build that "
        "asks for it; on Kubernetes built by the pod's init container"
    ),
    "uv": works(
        "a list, a requirements file in the working_dir, or the dict form (uv_check, uv_version, "
        "uv_pip_install_options); as pip"
    ),
    "conda": refused(_RUNTIME_ENV_PACKAGES),
    "container": refused(_RUNTIME_ENV_PACKAGES),
    "image_uri": partial(
        "the replica pods' image on Kubernetes; refused (400) by kubeserve start, whose replicas "
        "are local processes"
    ),
    "py_executable": refused(_RUNTIME_ENV_PACKAGES),
    "java_jars": refused("Java deployments are not supported"),
    "nsight": refused("Nsight profiling is not supported"),
    "worker_process_setup_hook": refused(
        "setup hooks are not supported: run setup code at import or in the constructor"
    ),
    "excludes": inert(
        "filters what Ray's client uploads from a local directory; kubeserve "
        "takes remote URIs only, so there is nothing to filter"
    ),
    "config": inert("Ray's runtime_env install options (setup timeout, eager install)"),
}

#: The options of Ray's ``@serve.deployment`` decorator that are no field of a config: the "model"
#: of their entries. Every other option of the decorator is the ``DeploymentSchema`` field of the
#: same name (or a model inside one), and the decorator asks this table about it as a PUT does
#: (:func:`kubeserve.sdk.deployment.normalize_options`).
DECORATOR = "serve.deployment"

#: ``"RayModelName.field"`` -> what kubeserve does with it.
SUPPORT: dict[str, Support] = {
    # ------------------------------------------------------------------ ServeDeploySchema
    "ServeDeploySchema.proxy_location": works(
        "EveryNode/HeadOnly: one proxy (kubeserve start), a DaemonSet or a Deployment "
        "(Kubernetes); Disabled: none"
    ),
    "ServeDeploySchema.http_options": works(),
    "ServeDeploySchema.grpc_options": works(),
    "ServeDeploySchema.controller_options": works(),
    "ServeDeploySchema.logging_config": works(
        "the proxies' logging (encoding, level, access lines), fixed while the serving layer "
        "runs: a change is a 409 saying to DELETE first"
    ),
    "ServeDeploySchema.tracing_config": works(),
    "ServeDeploySchema.target_capacity": works(
        "scales every deployment's replica count by the percentage"
    ),
    "ServeDeploySchema.applications": works(),
    # ------------------------------------------------------------------ HTTPOptionsSchema
    "HTTPOptionsSchema.host": works("fixed while the serving layer runs (409 otherwise)"),
    "HTTPOptionsSchema.port": works("fixed while the serving layer runs (409 otherwise)"),
    "HTTPOptionsSchema.root_path": works(
        "for a reverse proxy in front that strips it: routes match without it, and an ASGI "
        "ingress sees it before the route prefix in root_path and before the path, as in Ray; "
        "fixed while the serving layer runs (409 otherwise)"
    ),
    "HTTPOptionsSchema.request_timeout_s": works("a request over it is answered 408"),
    "HTTPOptionsSchema.keep_alive_timeout_s": works(),
    **{f"HTTPOptionsSchema.{field}": support for field, support in _TLS.items()},
    # ------------------------------------------------------------------ gRPCOptionsSchema
    "gRPCOptionsSchema.grpc_servicer_functions": works(
        "unary, server-streaming, client-streaming and bidirectional methods (the last two get a "
        "`gRPCInputStream`, as in Ray). The servicer modules must be importable by the proxy "
        "(where `kubeserve start` runs, or in the proxy's image); fixed while the serving layer "
        "runs"
    ),
    "gRPCOptionsSchema.port": works("fixed while the serving layer runs (409 otherwise)"),
    "gRPCOptionsSchema.request_timeout_s": works(
        "a call over it ends DEADLINE_EXCEEDED; fixed while the serving layer runs"
    ),
    "gRPCOptionsSchema.enable_reflection": works(
        "the proxy answers gRPC server reflection for the users' services (grpcurl, grpcui); "
        "fixed while the serving layer runs"
    ),
    # ------------------------------------------------------------------ ControllerOptions
    "ControllerOptions.runtime_env": refused(
        "the controller is kubeserve's own process (kubeserve start, or the operator's pod): set "
        "its environment where it is started",
        None,
        {},
    ),
    # ------------------------------------------------------------------ TracingConfig
    "TracingConfig.enabled": works(
        "OpenTelemetry spans per proxied request (HTTP, WebSocket, gRPC), replica call and "
        "handle call, one trace with the request id, a client's traceparent honoured, streams "
        "and sockets spanned until they end; needs kubeserve[tracing] where proxies and "
        "replicas run (the image has it); fixed while the serving layer runs (on Kubernetes "
        "a ServeInstance's may change: proxies and replicas restart, builds check it again)"
    ),
    "TracingConfig.exporter_import_path": works(
        "a function returning span processors (or exporters), importable by proxies and "
        "replicas; kubeserve start answers 400 at the field for a module it cannot find; the "
        "build imports it where the application runs (DEPLOY_FAILED naming the field if it "
        "does not import, on both backends); a proxy pod that cannot import it does not serve "
        "and the ServeInstance is UNHEALTHY saying why; empty: JSON lines in spans/ next to the "
        "logs (stderr in a pod)"
    ),
    "TracingConfig.sampling_ratio": works("parent-based, as in Ray: a sampled traceparent wins"),
    # ------------------------------------------------------------------ LoggingConfig
    **{f"LoggingConfig.{field}": support for field, support in _LOGGING.items()},
    # ------------------------------------------------------------------ ServeApplicationSchema
    "ServeApplicationSchema.name": works(),
    "ServeApplicationSchema.route_prefix": works("null: no HTTP route (handles only)"),
    "ServeApplicationSchema.import_path": works(),
    "ServeApplicationSchema.runtime_env": works(),
    "ServeApplicationSchema.host": works("single-application body; equals http_options.host"),
    "ServeApplicationSchema.port": works("single-application body; equals http_options.port"),
    "ServeApplicationSchema.deployments": works("overrides of the options set in code"),
    "ServeApplicationSchema.autoscaling_policy": works(
        "one policy for all the application's autoscaling deployments, called with "
        "Dict[DeploymentID, AutoscalingContext]; it takes precedence over deployment-level ones"
    ),
    "ServeApplicationSchema.args": works("passed to an application builder"),
    "ServeApplicationSchema.logging_config": works(),
    "ServeApplicationSchema.external_scaler_enabled": works(
        "POST /api/v1/applications/{app}/deployments/{deployment}/scale sets the replica count"
    ),
    # ------------------------------------------------------------------ DeploymentSchema
    "DeploymentSchema.name": works(),
    "DeploymentSchema.num_replicas": works('an integer, or "auto" (autoscaling)'),
    "DeploymentSchema.max_ongoing_requests": works(),
    "DeploymentSchema.max_queued_requests": works(),
    "DeploymentSchema.backpressure_config": works(),
    "DeploymentSchema.user_config": works("applied to running replicas with reconfigure()"),
    "DeploymentSchema.autoscaling_config": works(),
    "DeploymentSchema.graceful_shutdown_wait_loop_s": works(),
    "DeploymentSchema.graceful_shutdown_timeout_s": works(),
    "DeploymentSchema.health_check_period_s": works(),
    "DeploymentSchema.health_check_timeout_s": works(),
    "DeploymentSchema.ray_actor_options": works(),
    "DeploymentSchema.placement_group_bundles": _PLACEMENT_GROUPS,
    "DeploymentSchema.placement_group_strategy": _PLACEMENT_GROUPS,
    "DeploymentSchema.placement_group_bundle_label_selector": _PLACEMENT_GROUPS,
    "DeploymentSchema.max_replicas_per_node": works(
        "a hard cap per node, as in Ray (replicas beyond it stay pending, the deployment "
        "UPDATING with a message saying why): on Kubernetes a topology spread constraint on "
        "kubernetes.io/hostname; kubeserve start is one node"
    ),
    "DeploymentSchema.logging_config": works(),
    "DeploymentSchema.request_router_config": works(),
    "DeploymentSchema.gang_scheduling_config": refused("gang scheduling is not supported"),
    "DeploymentSchema.deployment_actors": refused(
        "deployment actors are not supported: start shared helpers in the replica", None, []
    ),
    "DeploymentSchema.rolling_update_percentage": works(
        "without a surge, the replicas replaced at a time (at least one); on Kubernetes the "
        "Deployment's `maxUnavailable`. With neither knob set, `kubeserve start` starts every "
        "new replica beside the old ones and Kubernetes uses Ray's default (0.2)"
    ),
    "DeploymentSchema.max_surge_percent": works(
        "replicas beyond the target while rolling (rounded up), none unavailable meanwhile; on "
        "Kubernetes the Deployment's `maxSurge`, with `maxUnavailable: 0`"
    ),
    # ------------------------------------------------------------------ RayActorOptionsSchema
    "RayActorOptionsSchema.runtime_env": works("merged over the application's runtime_env"),
    "RayActorOptionsSchema.num_cpus": works(
        "reserved from the instance's CPUs (kubeserve start --num-cpus) or as pod requests"
    ),
    "RayActorOptionsSchema.num_gpus": works(
        "on one machine devices are given per replica (whole ones, or a share of one: "
        "fractions pack together) and named in its CUDA_VISIBLE_DEVICES, as Ray does; "
        "nvidia.com/gpu on Kubernetes (the device plugin assigns them)"
    ),
    "RayActorOptionsSchema.memory": works(
        "reserved as in Ray: on one machine from what kubeserve start --memory gives it (as ray "
        "start --memory; default the machine's memory), a replica that does not fit staying "
        "pending, and the replica's cgroup memory limit; the pod's memory request and limit on "
        "Kubernetes"
    ),
    "RayActorOptionsSchema.resources": works(
        "reserved as in Ray (a replica that does not fit stays pending, the deployment UPDATING "
        "saying why): on Kubernetes extended resource requests; on one machine from what "
        "kubeserve start --resources gives it, as ray start --resources"
    ),
    "RayActorOptionsSchema.accelerator_type": works(
        "a node selector on Kubernetes; on one machine Ray's accelerator_type:<type> resource, "
        "which the node has when its first NVIDIA GPU is of that model (as Ray's raylet "
        "detects it) or kubeserve start --resources gives it; otherwise the replicas stay "
        "pending, the deployment UPDATING saying why"
    ),
    "RayActorOptionsSchema.label_selector": works(
        "conditions on node labels, as in Ray (a replica no node satisfies stays pending, the "
        "deployment UPDATING saying why): on Kubernetes a value is a nodeSelector entry and "
        "!value, in(a, b), !in(a, b) node affinity; kubeserve start is one node, labelled by "
        "kubeserve start --labels key=value,... as ray start --labels"
    ),
    "RayActorOptionsSchema.fallback_strategy": refused(
        "scheduling fallback strategies are not supported yet", None, []
    ),
    # ------------------------------------------------------------------ AutoscalingConfig
    **{
        f"AutoscalingConfig.{field}": works()
        for field in (
            "min_replicas",
            "initial_replicas",
            "max_replicas",
            "target_ongoing_requests",
            "metrics_interval_s",
            "look_back_period_s",
            "smoothing_factor",
            "upscale_smoothing_factor",
            "downscale_smoothing_factor",
            "upscaling_factor",
            "downscaling_factor",
            "downscale_delay_s",
            "downscale_to_zero_delay_s",
            "upscale_delay_s",
            "aggregation_function",
        )
    },
    "AutoscalingConfig.policy": works(),
    "AutoscalingPolicy.policy_function": works(
        "an import path, or in code the function or class, called with Ray's AutoscalingContext "
        "in the application's environment (kubeserve start: a process; Kubernetes: a policy "
        "host pod of the application's image, asked by the operator), its answer scaled, "
        "delayed and clamped as Ray does; one that raises, hangs or answers garbage leaves the "
        "count unchanged and says why in the deployment's message"
    ),
    "AutoscalingPolicy.policy_kwargs": works("passed to a policy class's constructor, as in Ray"),
    # ------------------------------------------------------------------ BackpressureConfig
    "BackpressureConfig.status_code": works(),
    "BackpressureConfig.retry_after_s": works(),
    # ------------------------------------------------------------------ RequestRouterConfig
    "RequestRouterConfig.request_router_class": works(
        "a subclass of ray.serve.request_router.RequestRouter, run by every proxy and handle "
        "calling the deployment; the replicas load it at start-up (a class that cannot be "
        "loaded fails the deploy) and hand it to callers pickled by value"
    ),
    "RequestRouterConfig.request_router_kwargs": works("passed to initialize_state"),
    "RequestRouterConfig.request_routing_stats_period_s": works(
        "each caller running a custom router polls record_routing_stats this often"
    ),
    "RequestRouterConfig.request_routing_stats_timeout_s": works(),
    "RequestRouterConfig.initial_backoff_s": works("custom routers' retry backoff"),
    "RequestRouterConfig.backoff_multiplier": works("custom routers' retry backoff"),
    "RequestRouterConfig.max_backoff_s": works("custom routers' retry backoff"),
    # ------------------------------------------------------------------ GangSchedulingConfig
    "GangSchedulingConfig.gang_size": inert("only inside gang_scheduling_config (refused)"),
    "GangSchedulingConfig.gang_placement_strategy": inert(
        "only inside gang_scheduling_config (refused)"
    ),
    "GangSchedulingConfig.runtime_failure_policy": inert(
        "only inside gang_scheduling_config (refused)"
    ),
    # ------------------------------------------------------------------ DeploymentActorConfig
    **{
        f"DeploymentActorConfig.{field}": inert("only inside deployment_actors (refused)")
        for field in ("name", "actor_class", "init_args", "init_kwargs", "actor_options")
    },
    # ------------------------------------------------------------------ not in Ray 2.60's schema
    "DeploymentSchema.route_prefix": refused(
        "a deployment's route_prefix was removed in Ray 2; set the application's route_prefix"
    ),
    "DeploymentSchema.is_driver_deployment": inert("a Ray-internal flag with no effect here"),
    "RayActorOptionsSchema.object_store_memory": inert("there is no object store"),
    "ControllerRuntimeEnv.env_vars": inert("only inside controller_options (refused)"),
    **{f"RuntimeEnv.{field}": support for field, support in _RUNTIME_ENV.items()},
    # ------------------------------------------------------------------ @serve.deployment only
    f"{DECORATOR}.version": refused(
        "it was removed from Ray Serve; replicas are replaced when code or config change"
    ),
    f"{DECORATOR}.max_constructor_retry_count": refused(
        "a failing replica is restarted with a backoff, without a count"
    ),
}


def _as_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    return value


def refusal(model: str, field: str, value: Any) -> str | None:
    """Why ``value`` given for ``model.field`` is refused, or ``None`` when it is accepted."""
    support = SUPPORT.get(f"{model}.{field}")
    if support is None or support.status != "refused":
        return None
    given = _as_json(value)
    if any(given == accepted for accepted in support.accepts):
        return None
    return f"{field} is not supported by kubeserve: {support.note}"


def markdown_table() -> str:
    """The README's table: every field, its status and the note."""
    lines = ["| Field | Status | Notes |", "|---|---|---|"]
    for key, support in SUPPORT.items():
        note = support.note.replace("|", "\\|")
        if support.status == "refused":
            allowed = ", ".join(json.dumps(v) for v in support.accepts)
            note = f"{note} (accepted: {allowed})"
        lines.append(f"| `{key}` | {support.status} | {note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
