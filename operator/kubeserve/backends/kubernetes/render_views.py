"""What the renderer reads: small frozen views of the custom resources and a deployment's config.

The operator builds the views from objects it already holds (:func:`instance_view`,
:func:`app_view`, :func:`deployment_view`); every renderer is a pure function of them. A view
carries plain data only, so the same views always render the same manifests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubeserve.control import effective_config
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.instance import tracing_config
from kubeserve.runtime.kubernetes import contract
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath, ProxyLocation
from kubeserve.schema.imperative import GRAPH_DIGEST_KEY
from kubeserve.schema.resources import (
    API_VERSION,
    AccessLines,
    ProxyTLS,
    ServeInstanceSpec,
    ServeInstanceSpecBase,
)

__all__ = [
    "AppView",
    "DesiredDeployment",
    "InstanceView",
    "RenderError",
    "app_view",
    "build_name",
    "deployment_view",
    "instance_view",
    "own_graph_name",
]

#: Length of :attr:`AppView.build_key` (hex digits).
_BUILD_KEY_LENGTH = 10
#: Length of the digest in :func:`build_name` (hex digits): builds of different code must never
#: share a name in one namespace, so longer than a per-application key
_SHARED_BUILD_KEY_LENGTH = 16


class RenderError(ValueError):
    """A spec that validates but cannot be expressed as Kubernetes objects; the message says why
    and names the field (the operator reports it in the application's status)."""


@dataclass(frozen=True)
class InstanceView:
    """A ``ServeInstance``: identity and validated spec (camelCase model, snake_case attributes)."""

    name: str
    namespace: str
    uid: str
    spec: ServeInstanceSpecBase
    #: where the instance's pods reach the operator's admin server to report requests waiting for
    #: replicas (:mod:`kubeserve.runtime.load_report`); ``None``: they do not report, and
    #: deployments cannot scale to zero
    report_url: str | None = None
    #: the operator's data path for an instance whose ``spec.proxy.dataPath`` is unset
    default_data_path: DataPath = DEFAULT_DATA_PATH
    #: the operator's choice for an instance whose ``spec.proxy.nodeLocalSockets`` is unset
    #: (``DataPlane.node_sockets``: whether the namespace admits such pods)
    sockets_admitted: bool = False

    @property
    def image(self) -> str:
        return str(self.spec.image)

    @property
    def target_capacity(self) -> float | None:
        """``target_capacity`` percent (Ray's), ``None`` when unset."""
        value = self.spec.rest_options().get("target_capacity")
        return None if value is None else float(value)

    @property
    def logging_config(self) -> dict[str, Any] | None:
        """The serve config's top-level ``logging_config`` (the proxies'), when given."""
        value = self.spec.rest_options().get("logging_config")
        return None if value is None else dict(value)

    @property
    def tracing_config(self) -> dict[str, Any] | None:
        """The serve config's ``tracing_config`` (defaults filled) when it enables tracing."""
        return tracing_config(self.spec.rest_options())

    @property
    def grpc_options(self) -> dict[str, Any]:
        """The serve config's ``grpc_options`` (REST spelling), ``{}`` when not given."""
        return dict(self.spec.rest_options().get("grpc_options") or {})

    @property
    def image_pull_policy(self) -> str | None:
        return self.spec.image_pull_policy

    @property
    def proxy_location(self) -> ProxyLocation:
        return ProxyLocation(cast(Any, self.spec).proxy_location)

    @property
    def http_options(self) -> Any:
        """The spec's ``httpOptions`` model (``port``, ``request_timeout_s``...)."""
        return cast(Any, self.spec).http_options

    @property
    def data_path(self) -> DataPath:
        """``spec.proxy.dataPath``, else the operator's default."""
        chosen = self.spec.proxy.data_path if self.spec.proxy else None
        return self.default_data_path if chosen is None else chosen

    @property
    def data_path_flag(self) -> str | None:
        """The proxies' ``--data-path``: ``python`` for the Python path; ``native`` when
        ``spec.proxy.dataPath`` asks for it (an image without ``kubeserve-fastpath`` then fails,
        saying so); none when native is the operator's default: the proxy's own default, native,
        or python, said once in its log, in an image without the binary (a user's image with
        kubeserve pip-installed)."""
        if self.data_path is DataPath.PYTHON:
            return DataPath.PYTHON.value
        chosen = self.spec.proxy.data_path if self.spec.proxy else None
        return None if chosen is None else DataPath.NATIVE.value

    @property
    def node_local_sockets(self) -> bool:
        """``spec.proxy.nodeLocalSockets``, else the operator's choice: replicas also listen,
        and callers connect, through the node's directory of replica sockets."""
        chosen = self.spec.proxy.node_local_sockets if self.spec.proxy else None
        return self.sockets_admitted if chosen is None else chosen

    @property
    def access_lines_to_file(self) -> bool:
        """``spec.logs.accessLines`` is ``File`` (the default): proxies and replicas write their
        access lines to a rotated file in the pod, not to the container's output."""
        chosen = self.spec.logs.access_lines if self.spec.logs else AccessLines.FILE
        return chosen is AccessLines.FILE

    @property
    def tls(self) -> ProxyTLS | None:
        """``spec.tls``: the Secret the proxies serve HTTPS from, if any."""
        return self.spec.tls

    def owner(self) -> dict[str, str]:
        return {
            "apiVersion": API_VERSION,
            "kind": "ServeInstance",
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(frozen=True)
class AppView:
    """A ``ServeApplication``: identity and its config in REST spelling.

    ``config`` is one REST ``applications[]`` element (``name``, ``import_path``, ``runtime_env``,
    ``args``, ``deployments``...), as :meth:`ServeApplicationSpecBase.to_rest` gives it.
    """

    cr_name: str
    namespace: str
    uid: str
    config: Mapping[str, Any]
    #: the instance's :attr:`InstanceView.tracing_config` (when it enables tracing): the build
    #: checks that its exporter imports where the application runs
    tracing_config: Mapping[str, Any] | None = None

    @property
    def app_name(self) -> str:
        """The Ray application name (:func:`~kubeserve.runtime.kubernetes.contract.application_name`
        of the object, which the config carries)."""
        return str(self.config["name"])

    @property
    def runtime_env(self) -> Mapping[str, Any]:
        return self.config.get("runtime_env") or {}

    @property
    def code_key(self) -> str:
        """Identifies the application's code: import path (or pickled graph), runtime_env and
        args (what the policy host runs; a new one restarts it)."""
        return effective_config.fingerprint(self._code_inputs())[:_BUILD_KEY_LENGTH]

    @property
    def build_key(self) -> str:
        """Identifies what a build depends on: the code (:attr:`code_key`'s inputs) and, when
        tracing is on, the instance's ``tracing_config``, whose exporter the build checks.

        Builds are keyed by it rather than by ``metadata.generation``: a new generation that only
        changes overrides, ``user_config`` or replica counts reuses the last build, as the local
        backend does; a changed ``tracing_config`` builds again, so an exporter set later that
        does not import fails the application, and its fix recovers it.
        """
        inputs = self._code_inputs()
        if self.tracing_config is not None:  # only then: an untraced build keeps its key
            inputs.append(dict(self.tracing_config))
        return effective_config.fingerprint(inputs)[:_BUILD_KEY_LENGTH]

    def _code_inputs(self) -> list[Any]:
        inputs = [self.config.get("import_path"), self.runtime_env, self.config.get("args")]
        if self.graph_digest is not None:  # only then: a declarative build keeps its key
            inputs.append(self.graph_digest)
        return inputs

    @property
    def graph_digest(self) -> str | None:
        """An application deployed with ``serve.run``: the SHA-256 of its pickled graph."""
        digest = self.config.get(GRAPH_DIGEST_KEY)
        return None if digest is None else str(digest)

    @property
    def graph_secret(self) -> str | None:
        """The Secret holding the pickled graph (``None``: a declarative application)."""
        digest = self.graph_digest
        if digest is None:
            return None
        return contract.pickled_graph_secret_name(self.cr_name, self.uid, digest)

    def owner(self) -> dict[str, str]:
        return {
            "apiVersion": API_VERSION,
            "kind": "ServeApplication",
            "name": self.cr_name,
            "uid": self.uid,
        }


@dataclass(frozen=True)
class DesiredDeployment:
    """One serve deployment of an application, as the renderers want it.

    ``config`` is the deployment's effective config; ``version`` is
    :func:`~kubeserve.control.effective_config.replica_version`. ``replicas`` overrides the count
    :meth:`~kubeserve.control.effective_config.EffectiveDeployment.target_replicas` gives (the
    autoscaler's current decision). Which deployment is the ingress is not part of it: nothing
    rendered depends on that, so moving the ingress never restarts pods.
    """

    name: str
    config: EffectiveDeployment
    version: str
    replicas: int | None = None

    @property
    def target_replicas(self) -> int:
        if self.replicas is not None:
            return self.replicas
        return self.config.target_replicas()

    @property
    def actor_options(self) -> Mapping[str, Any]:
        return self.config.ray_actor_options


def instance_view(
    obj: Mapping[str, Any],
    report_url: str | None = None,
    default_data_path: DataPath = DEFAULT_DATA_PATH,
    sockets_admitted: bool = False,
) -> InstanceView:
    """The view of a ``ServeInstance`` object; pydantic's ``ValidationError`` on a bad spec.
    ``report_url``: the operator's, for the pods' load reports (:attr:`InstanceView.report_url`);
    ``default_data_path``: the operator's (:attr:`InstanceView.data_path`);
    ``sockets_admitted``: the operator's choice (:attr:`InstanceView.node_local_sockets`).
    """
    meta = obj["metadata"]
    spec = ServeInstanceSpec.model_validate(obj.get("spec") or {})
    return InstanceView(
        name=str(meta["name"]),
        namespace=str(meta["namespace"]),
        uid=str(meta["uid"]),
        spec=spec,
        report_url=report_url,
        default_data_path=default_data_path,
        sockets_admitted=sockets_admitted,
    )


def app_view(
    obj: Mapping[str, Any],
    app_config: Mapping[str, Any],
    tracing: Mapping[str, Any] | None = None,
) -> AppView:
    """The view of a ``ServeApplication`` object whose spec translates to ``app_config`` (REST);
    ``tracing`` is its instance's :attr:`InstanceView.tracing_config`."""
    meta = obj["metadata"]
    return AppView(
        cr_name=str(meta["name"]),
        namespace=str(meta["namespace"]),
        uid=str(meta["uid"]),
        config=app_config,
        tracing_config=tracing,
    )


def deployment_view(
    app_config: Mapping[str, Any],
    effective: EffectiveDeployment,
    replicas: int | None = None,
) -> DesiredDeployment:
    """The view of a deployment whose effective config is ``effective`` (name included)."""
    return DesiredDeployment(
        name=effective.name,
        config=effective,
        version=effective_config.replica_version(app_config, effective),
        replicas=replicas,
    )


def build_name(instance: InstanceView, app: AppView) -> str:
    """The name of the build Job (and of the graph ConfigMap it writes) that ``app`` uses, one per
    distinct build input in the namespace: every application of ``instance`` whose build reads
    the same inputs shares it.

    The inputs are everything the build Job's pod is made of: the instance (its build
    ServiceAccount), its image and pull policy (the default image of ``runtime_env``), and
    :attr:`AppView.build_key`'s (import path, ``runtime_env``, ``args``, the instance's
    ``tracing_config``). Not the application's name nor its deployments' overrides: the build
    never reads them. An application deployed with ``serve.run`` mounts its own graph Secret,
    so its build is its own (the Secret's name is an input).
    """
    inputs = [
        instance.name,
        instance.image,
        instance.image_pull_policy,
        app.config.get("import_path"),
        app.runtime_env,
        app.config.get("args"),
        app.graph_secret,
        None if app.tracing_config is None else dict(app.tracing_config),
    ]
    key = effective_config.fingerprint(inputs)[:_SHARED_BUILD_KEY_LENGTH]
    return contract.shared_build_name(instance.name, key)


def own_graph_name(app: AppView) -> str:
    """The graph ConfigMap an application's own build wrote before builds were shared
    (``<app>-graph-<build_key>``, owned by it alone): the operator keeps using it until the
    application's build inputs change, so an upgrade of the operator rebuilds nothing."""
    return contract.graph_configmap_name(app.cr_name, app.build_key)
