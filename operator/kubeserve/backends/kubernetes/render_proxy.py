"""What a ``ServeInstance`` owns: its proxies and the RBAC its pods run with (pure).

Proxies (``<inst>-proxy``): none for ``Disabled``, a one-replica Deployment for ``HeadOnly``, a
DaemonSet for ``EveryNode``, and a ClusterIP Service on ``httpOptions.port``. A proxy runs
``kubeserve proxy --host $(KUBESERVE_BIND_HOST) --port <port> --discovery kubernetes`` (plus
``--request-timeout-s`` when set and ``--keep-alive-timeout-s``) with ``KUBESERVE_INSTANCE`` naming
its instance, whose applications' routes it serves. On SIGTERM it serves on until another proxy is
ready and kube-proxy dropped it, then drains (``--replacement-wait-s``, ``--leave-delay-s``,
``--drain-timeout-s``; the pod's grace period covers them). ``httpOptions.host`` has no meaning in
a pod (a proxy binds its pod's address). ``rootPath`` (where an Ingress in front, which strips it,
mounts the instance) reaches the replicas, whose ASGI ingresses see it in ``root_path`` and
``path`` (:func:`~kubeserve.backends.kubernetes.render.replica_config_json`).
With ``spec.tls`` the proxies serve HTTPS from that Secret, mounted at :data:`TLS_DIR`.
With ``spec.proxy.dataPath: native`` (or the operator's default, for an instance that does not
choose) a proxy runs with ``--data-path native``: the image's ``kubeserve-fastpath`` serves the
requests it covers in front of the Python proxy (:mod:`kubeserve.runtime.fastpath`).

The data-plane Secret ``<inst>-dataplane-secret`` (:func:`render_data_plane_secret`): the key of
the handshake every connection to a replica passes; proxies and replicas read it from their env.

RBAC, least privilege, one set per instance so deleting an instance removes exactly its own:

* ``<inst>-dataplane`` (proxies and replicas): ``get/list/watch`` on ``serveapplications`` (routes,
  and a replica's ``user_config`` at start-up) and ``endpointslices`` (replica addresses);
* ``<inst>-build`` (build Jobs): ``create`` on ``configmaps``, to write the graph. A build treats
  ``AlreadyExists`` as done, so it needs neither ``get`` nor ``patch``.

The operator can only grant what it holds itself, so its own role needs these rules too.
"""

from __future__ import annotations

import base64
import json

from kubeserve.backends.kubernetes.render_pod import (
    Manifest,
    container,
    data_plane_secret_env,
    environment,
    escape,
    pod_spec,
    with_access_log_file,
    with_node_sockets,
)
from kubeserve.backends.kubernetes.render_views import InstanceView
from kubeserve.control.instance import grpc_proxy_arguments
from kubeserve.runtime import wire
from kubeserve.runtime.fastpath import ALLOCATOR_ENV
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.contract import (
    BIND_HOST_ENV,
    DISCOVERY_KUBERNETES,
    GROUP,
    INSTANCE_ENV,
    KUBERNETES_NAMESPACE_LABEL,
)
from kubeserve.schema.config import ProxyLocation

__all__ = [
    "BUILD_RULES",
    "DATAPLANE_RULES",
    "render_data_plane_secret",
    "render_dataplane_rbac",
    "render_metrics_token_secret",
    "render_network_policies",
    "render_proxy",
]

_READ = ["get", "list", "watch"]
DATAPLANE_RULES: list[Manifest] = [
    {"apiGroups": [GROUP], "resources": ["serveapplications"], "verbs": _READ},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _READ},
]
BUILD_RULES: list[Manifest] = [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
]
_PROXY_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}}
#: where a proxy pod mounts the ``spec.tls`` Secret
TLS_DIR = "/etc/kubeserve/tls"
_TLS_VOLUME = "tls"


def _metadata(instance: InstanceView, name: str, labels: dict[str, str]) -> Manifest:
    return {
        "name": name,
        "namespace": instance.namespace,
        "labels": labels,
        "ownerReferences": [contract.owner_reference(instance.owner())],
    }


def _proxy_command(instance: InstanceView) -> list[str]:
    http = instance.http_options
    command = ["kubeserve", "proxy", "--host", f"$({BIND_HOST_ENV})", "--port", str(http.port)]
    command += ["--discovery", DISCOVERY_KUBERNETES]
    if instance.report_url:  # requests waiting for replicas are reported to the operator
        command += ["--controller-url", instance.report_url]
    if http.request_timeout_s is not None:
        command += ["--request-timeout-s", str(float(http.request_timeout_s))]
    if instance.logging_config:  # Ray's logging_config for the proxies: encoding, level, access
        logging_config = json.dumps(instance.logging_config, sort_keys=True)
        command += ["--logging-config", escape(logging_config)]
    if instance.tracing_config:  # proxies trace as the replicas do (kubeserve.runtime.tracing)
        tracing = json.dumps(instance.tracing_config, sort_keys=True)
        command += ["--tracing-config", escape(tracing)]
    if instance.tls is not None:  # the Secret's files, as cert-manager names them
        command += ["--ssl-certfile", f"{TLS_DIR}/tls.crt", "--ssl-keyfile", f"{TLS_DIR}/tls.key"]
        if instance.tls.require_client_certificates:
            command += ["--ssl-ca-certs", f"{TLS_DIR}/ca.crt"]
    command += grpc_proxy_arguments(instance.grpc_options)
    if instance.data_path_flag is not None:
        command += ["--data-path", instance.data_path_flag]
    command += ["--replacement-wait-s", str(contract.PROXY_REPLACEMENT_WAIT_S)]
    command += ["--leave-delay-s", str(contract.PROXY_LEAVE_DELAY_S)]
    command += ["--drain-timeout-s", str(contract.PROXY_DRAIN_S)]
    return [*command, "--keep-alive-timeout-s", str(int(http.keep_alive_timeout_s))]


def _grpc_port(instance: InstanceView) -> int | None:
    """The port the proxies serve gRPC on, when they do (servicer functions are given)."""
    arguments = grpc_proxy_arguments(instance.grpc_options)
    return int(arguments[1]) if arguments else None


def _probes(instance: InstanceView, port: int) -> tuple[Manifest, Manifest]:
    """Readiness and liveness: ``/-/healthz`` on the serving port. With TLS, readiness over HTTPS
    (the kubelet does not verify the certificate), or a TCP connection when clients need a
    certificate, which the kubelet cannot present; liveness a TCP connection to the metrics port,
    which listens while the proxy waits for TLS files that do not load (a Secret updated with a
    bad pair): not Ready then, but not restarted in a loop either."""
    if instance.tls is None:
        probe = {"httpGet": {"path": wire.HEALTHZ_PATH, "port": port}}
        return probe, probe
    alive = {"tcpSocket": {"port": contract.METRICS_PORT}}
    if instance.tls.require_client_certificates:
        return {"tcpSocket": {"port": port}}, alive
    return {"httpGet": {"path": wire.HEALTHZ_PATH, "port": port, "scheme": "HTTPS"}}, alive


def _proxy_container(instance: InstanceView) -> Manifest:
    port = int(instance.http_options.port)
    own = {
        INSTANCE_ENV: instance.name,
        contract.METRICS_PORT_ENV: str(contract.METRICS_PORT),
        **ALLOCATOR_ENV,
    }
    env = environment({}, own, [data_plane_secret_env(instance.name)])
    spec = container(
        "proxy", instance.image, instance.image_pull_policy, _proxy_command(instance), env
    )
    if instance.tls is not None:
        spec["volumeMounts"] = [{"name": _TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True}]
    ready, alive = _probes(instance, port)
    ports = [
        {"name": "http", "containerPort": port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": contract.METRICS_PORT, "protocol": "TCP"},
    ]
    grpc_port = _grpc_port(instance)
    if grpc_port is not None:
        ports.append({"name": "grpc", "containerPort": grpc_port, "protocol": "TCP"})
    return spec | {
        "ports": ports,
        "resources": _PROXY_RESOURCES,
        # every 2 s: a replacement proxy is Ready (and the one it replaces may leave) sooner
        "readinessProbe": {**ready, "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {**alive, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        # a proxy that cannot start (a tracing exporter that does not import...) says why last:
        # the operator reports it in the instance's status (pods.exit_failure)
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _tls_volumes(instance: InstanceView) -> list[Manifest]:
    """The ``spec.tls`` Secret as a volume: the kubelet swaps its files in place when the Secret
    changes (a renewal), and the proxy reloads them (:mod:`kubeserve.runtime.tls`)."""
    if instance.tls is None:
        return []
    secret = {"secretName": instance.tls.secret_name, "defaultMode": 0o440}
    return [{"name": _TLS_VOLUME, "secret": secret}]


def render_proxy(instance: InstanceView) -> list[Manifest]:
    """The proxy workload and its Service, or ``[]`` when proxies are disabled."""
    if instance.proxy_location is ProxyLocation.DISABLED:
        return []
    name = contract.proxy_name(instance.name)
    labels = contract.common_labels(contract.COMPONENT_PROXY, instance.name)
    selector = contract.selector_labels(contract.COMPONENT_PROXY, instance=instance.name)
    account = contract.dataplane_account_name(instance.name)
    pod = pod_spec(
        [_proxy_container(instance)],
        account,
        volumes=_tls_volumes(instance),
        terminationGracePeriodSeconds=contract.PROXY_GRACE_S,
    )
    if instance.node_local_sockets:
        pod = with_node_sockets(pod, instance.namespace, instance.name)
    if instance.access_lines_to_file:
        pod = with_access_log_file(pod)
    template = {
        "metadata": {"labels": labels, "annotations": dict(contract.SCRAPE_ANNOTATIONS)},
        "spec": pod,
    }
    spec: Manifest = {"selector": {"matchLabels": selector}, "template": template}
    # Surge first: a new proxy starts beside the one it replaces, which goes only once the new
    # one is Ready, so a new proxy that never is (an exporter that does not import) leaves the
    # old one serving. A DaemonSet may surge because the proxy binds no hostPort.
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    if instance.proxy_location is ProxyLocation.EVERY_NODE:
        kind, spec["updateStrategy"] = "DaemonSet", rolling
    else:
        kind, spec["replicas"], spec["strategy"] = "Deployment", 1, rolling
    workload = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _metadata(instance, name, labels),
        "spec": spec,
    }
    port = int(instance.http_options.port)
    ports: list[Manifest] = [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]
    grpc_port = _grpc_port(instance)
    if grpc_port is not None:  # plain-text HTTP/2: gRPC without TLS
        ports.append(
            {
                "name": "grpc",
                "port": grpc_port,
                "targetPort": grpc_port,
                "protocol": "TCP",
                "appProtocol": "kubernetes.io/h2c",
            }
        )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(instance, name, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": ports,
        },
    }
    return [workload, service]


def _account(
    instance: InstanceView, name: str, component: str, rules: list[Manifest]
) -> list[Manifest]:
    """A ServiceAccount with a Role of the same name bound to it."""
    labels = contract.common_labels(component, instance.name)
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(instance, name, labels),
        },
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": _metadata(instance, name, labels),
            "rules": rules,
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": _metadata(instance, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": instance.namespace}],
        },
    ]


def render_dataplane_rbac(instance: InstanceView) -> list[Manifest]:
    """ServiceAccounts, Roles and RoleBindings of the instance's pods: data plane, then builds."""
    return [
        *_account(
            instance,
            contract.dataplane_account_name(instance.name),
            contract.COMPONENT_PROXY,
            DATAPLANE_RULES,
        ),
        *_account(
            instance,
            contract.build_account_name(instance.name),
            contract.COMPONENT_BUILD,
            BUILD_RULES,
        ),
    ]


def render_data_plane_secret(instance: InstanceView, value: str) -> Manifest:
    """The instance's data-plane Secret holding ``value``.

    The operator draws ``value`` at random once and creates this object only when it is missing
    (rendering stays pure; a re-render would not know the value). Immutable: a changed secret
    would split the data plane in two until every pod restarted; to rotate it, delete the Secret
    and the pods (the operator creates a fresh one).
    """
    name = contract.dataplane_secret_name(instance.name)
    return _immutable_secret(instance, name, contract.DATA_PLANE_SECRET_KEY, value)


def render_metrics_token_secret(instance: InstanceView, token: str) -> Manifest:
    """The Secret holding the bearer token of the instance's metrics ports, for Prometheus
    (:func:`kubeserve.runtime.metrics_listener.metrics_token` of the data-plane secret: it
    reveals nothing of that secret). Immutable, like the data-plane Secret it derives from."""
    name = contract.metrics_token_secret_name(instance.name)
    return _immutable_secret(instance, name, contract.METRICS_TOKEN_KEY, token)


def _immutable_secret(instance: InstanceView, name: str, key: str, value: str) -> Manifest:
    labels = contract.common_labels(contract.COMPONENT_PROXY, instance.name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(instance, name, labels),
        "type": "Opaque",
        "immutable": True,
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


def _policy(instance: InstanceView, component: str, ingress: list[Manifest]) -> Manifest:
    labels = contract.common_labels(component, instance.name)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(
            instance, contract.network_policy_name(instance.name, component), labels
        ),
        "spec": {
            "podSelector": {
                "matchLabels": contract.selector_labels(component, instance=instance.name)
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def render_network_policies(
    instance: InstanceView,
    operator_namespace: str,
    replica_port: int,
    probe_port: int,
    policy_port: int,
) -> list[Manifest]:
    """Who may connect to the instance's pods (ingress only; enforced by the cluster's network
    plugin, where it enforces NetworkPolicies).

    * ``<inst>-replicas``: the replica port (``replica_port``) only from the instance's own proxy
      and replica pods (labels ``kubeserve.io/instance`` and ``app.kubernetes.io/component``) and
      from the operator's pods
      (:data:`~kubeserve.runtime.kubernetes.contract.OPERATOR_POD_LABELS` in
      ``operator_namespace``), which push ``user_config``; the probe port (``probe_port``) from
      anywhere, for kubelets; the metrics port from anywhere, for Prometheus (it needs the
      metrics token); nothing else. The handshake already refuses strangers: this keeps them from
      even connecting.
    * ``<inst>-autoscaling-policies``: the policy hosts' port (``policy_port``) only from the
      operator's pods, the one caller of custom autoscaling policies.
    * ``<inst>-proxies`` (when proxies run): the proxy's HTTP port, its gRPC port (when it
      serves gRPC) and its metrics port from anywhere.
    """
    peers = {
        "podSelector": {
            "matchLabels": {
                contract.NAME_LABEL: contract.PRODUCT,
                contract.INSTANCE_LABEL: contract.label_value(instance.name),
            },
            "matchExpressions": [
                {
                    "key": contract.COMPONENT_LABEL,
                    "operator": "In",
                    "values": [contract.COMPONENT_PROXY, contract.COMPONENT_REPLICA],
                }
            ],
        }
    }
    operator = {
        "namespaceSelector": {"matchLabels": {KUBERNETES_NAMESPACE_LABEL: operator_namespace}},
        "podSelector": {"matchLabels": dict(contract.OPERATOR_POD_LABELS)},
    }
    replicas = _policy(
        instance,
        contract.COMPONENT_REPLICA,
        [
            {"ports": [{"port": replica_port, "protocol": "TCP"}], "from": [peers, operator]},
            {"ports": [{"port": probe_port, "protocol": "TCP"}]},
            {"ports": [{"port": contract.METRICS_PORT, "protocol": "TCP"}]},
        ],
    )
    policies = _policy(
        instance,
        contract.COMPONENT_POLICY,
        [{"ports": [{"port": policy_port, "protocol": "TCP"}], "from": [operator]}],
    )
    if instance.proxy_location is ProxyLocation.DISABLED:
        return [replicas, policies]
    port = int(instance.http_options.port)
    open_ports = [
        {"port": port, "protocol": "TCP"},
        {"port": contract.METRICS_PORT, "protocol": "TCP"},
    ]
    grpc_port = _grpc_port(instance)
    if grpc_port is not None:
        open_ports.append({"port": grpc_port, "protocol": "TCP"})
    proxies = _policy(instance, contract.COMPONENT_PROXY, [{"ports": open_ports}])
    return [replicas, proxies, policies]
