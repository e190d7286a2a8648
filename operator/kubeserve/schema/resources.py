"""The custom resources ``ServeInstance`` and ``ServeApplication``: spec and status models.

One model set, two spellings. A custom resource spells every REST field in camelCase
(``import_path`` -> ``importPath``), and its models are *derived* from the REST models in
:mod:`.config` rather than written again: :func:`cr_variant` makes a subclass of a REST model whose
only difference is the alias generator (validators, constraints and defaults are inherited), with
nested REST models replaced by their variants. Attribute names stay snake_case, so
``variant.model_dump(by_alias=False)`` is the REST body and the REST model validates it.

Where a custom resource differs from the REST body, on purpose and nowhere else:

- ``ServeApplication.spec`` is one element of the REST ``applications`` list without ``name``,
  ``host`` and ``port``: the application is named by the object's ``metadata.name``, or by
  ``spec.appName`` when the Ray name is not a valid Kubernetes name (Ray allows any string);
  ``host``/``port`` belong to the serving layer (``ServeInstance.spec.httpOptions``). It adds
  ``instance``, the name of its ``ServeInstance`` in the same namespace (default ``default``).
- ``ServeInstance.spec`` is the REST ``ServeDeploySchema`` without ``applications`` (each is a
  ``ServeApplication``), plus ``image`` and ``imagePullPolicy`` for the pods the operator runs.
- The REST API accepts two spellings of two settings (``max_concurrent_queries`` /
  ``max_ongoing_requests``, ``cluster_actor_options`` / ``ray_actor_options``); a custom resource
  has one name for each, Ray's: ``maxOngoingRequests`` and ``rayActorOptions``.
- Free-form user objects (``userConfig``, ``args``, ``envVars``, ``resources``...) keep their keys
  exactly as given: the alias generator renames fields, never the keys of a mapping.

Translation (pure functions, used by the operator and by the admin API over the Kubernetes
backend): :meth:`ServeApplicationSpecBase.to_rest` / :meth:`ServeApplicationSpecBase.from_rest` and
:meth:`ServeInstanceSpecBase.rest_options` / :meth:`ServeInstanceSpecBase.from_rest`. Both
directions keep "which fields were given" (``exclude_unset``), which the REST semantics of
deployment overrides and ``deployed_app_config`` depend on.

Cross-field rules raised by REST validators report their path in the REST spelling (for example
``["autoscalingConfig", "max_replicas"]``); the API server checks the same rules first, with
camelCase paths, through the CRD's CEL rules (:mod:`.crd`).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from copy import copy
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from kubeserve.schema.config import (
    DataPath,
    ImportPath,
    ServeApplicationEntry,
    ServeApplicationSchema,
    ServeDeploySchema,
)
from kubeserve.schema.errors import field_error
from kubeserve.schema.imperative import GRAPH_DIGEST_KEY
from kubeserve.schema.status import (
    ApplicationStatus,
    DeploymentStatus,
    DeploymentStatusTrigger,
    ProxyDetails,
)

__all__ = [
    "API_VERSION",
    "CR_MODEL_CONFIG",
    "DEFAULT_IMAGE",
    "DEFAULT_INSTANCE",
    "GROUP",
    "VERSION",
    "AccessLines",
    "ApplicationSummary",
    "CRModel",
    "Condition",
    "DeploymentStatusEntry",
    "InstanceLogs",
    "InstanceProxy",
    "NodeSocketsStatus",
    "PickledGraphReference",
    "ServeApplicationSpec",
    "ServeApplicationSpecBase",
    "ServeApplicationStatus",
    "ServeInstanceSpec",
    "ServeInstanceSpecBase",
    "ServeInstanceState",
    "ServeInstanceStatus",
    "cr_variant",
]

GROUP = "kubeserve.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Image of the operator, proxy, replica and build pods when ``ServeInstance.spec.image`` is unset.
DEFAULT_IMAGE = "kubeserve:0.1.0"
#: The ``ServeInstance`` an application belongs to when ``spec.instance`` is unset.
DEFAULT_INSTANCE = "default"

#: camelCase in and out. Validation accepts only the camelCase names (a snake_case key is an
#: unknown field, as the API server would say); ``model_dump()`` writes camelCase, and
#: ``model_dump(by_alias=False)`` writes the REST spelling.
CR_MODEL_CONFIG = ConfigDict(
    alias_generator=to_camel,
    validate_by_alias=True,
    validate_by_name=False,
    serialize_by_alias=True,
    extra="forbid",
    allow_inf_nan=False,
)

#: Marks a field whose default the CRD carries, so the API server fills it in (see :mod:`.crd`).
#: Only fields whose "given or not" does not matter to REST semantics are marked.
CRD_DEFAULT: dict[str, Any] = {"x-kubeserve-crd-default": True}


class CRModel(BaseModel):
    """Base of the models declared only for custom resources (not derived from REST models)."""

    model_config = CR_MODEL_CONFIG


# --------------------------------------------------------------------------- camelCase variants

_M = TypeVar("_M", bound=BaseModel)
_VARIANTS: dict[type[BaseModel], type[BaseModel]] = {}


def cr_variant(rest: type[_M]) -> type[_M]:
    """The camelCase subclass of a REST model (cached: one variant per model).

    Inherits fields, validators and defaults; replaces nested models by their variants, and drops
    the REST models' explicit validation aliases (the second spelling of a synonym pair).
    """
    if rest in _VARIANTS:
        return typing.cast(type[_M], _VARIANTS[rest])
    overrides = _cr_fields(rest, only_changed=True)

    def body(ns: dict[str, Any]) -> None:
        ns.update(
            model_config=CR_MODEL_CONFIG,
            __module__=__name__,
            __qualname__=rest.__qualname__,
            __doc__=rest.__doc__,
            __annotations__={name: ann for name, (ann, _) in overrides.items()},
            **{name: info for name, (_, info) in overrides.items()},
        )

    variant = types.new_class(rest.__name__, (rest,), exec_body=body)
    _VARIANTS[rest] = variant
    return typing.cast(type[_M], variant)


def _cr_fields(
    rest: type[BaseModel], *, only_changed: bool = False, omit: frozenset[str] = frozenset()
) -> dict[str, tuple[Any, FieldInfo]]:
    """Field definitions of ``rest`` for a camelCase model: same constraints, camelCase names."""
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for name, info in rest.model_fields.items():
        annotation = _cr_annotation(info.annotation)
        explicit_alias = info.validation_alias is not None or info.alias_priority == 2
        if name in omit or (only_changed and annotation is info.annotation and not explicit_alias):
            continue
        new = copy(info)
        new.alias = new.validation_alias = new.serialization_alias = None
        new.alias_priority = None
        fields[name] = (annotation, new)
    return fields


def _cr_annotation(tp: Any) -> Any:
    """``tp`` with every REST model in it replaced by its variant (``tp`` itself if none)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return cr_variant(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is None or origin is Literal:
        return tp
    if origin is Annotated:
        inner = _cr_annotation(args[0])
        return tp if inner is args[0] else Annotated[(inner, *tp.__metadata__)]
    new_args = tuple(_cr_annotation(a) for a in args)
    if all(new is old for new, old in zip(new_args, args, strict=True)):
        return tp
    if origin in (Union, types.UnionType):
        return Union[new_args]  # noqa: UP007 - a runtime-built union
    return origin[new_args]


# --------------------------------------------------------------------------- ServeApplication spec


class PickledGraphReference(CRModel):
    """``ServeApplication.spec.pickledGraph``: the graph a driver's ``serve.run`` pickled."""

    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (hex) of the pickled graph; the Secret holding it is named from "
        "it, the object's name and uid.",
    )


class ServeApplicationSpecBase(CRModel):
    """``ServeApplication.spec``: one application (REST ``applications[]`` element, camelCase).

    The application's name is ``appName`` when given, else the object's ``metadata.name``.
    """

    #: The REST model a spec translates to; :mod:`.crd` also takes its CEL rules from it.
    rest_model: ClassVar[type[BaseModel]] = ServeApplicationEntry
    #: the model's name in Ray's schema (see :mod:`kubeserve.schema.support`)
    ray_name: ClassVar[str] = "ServeApplicationSchema"

    app_name: str | None = Field(
        default=None,
        min_length=1,
        description="Application name (Ray's `name`). Default: metadata.name. Set it when the "
        "name is not a valid Kubernetes object name.",
    )
    instance: str = Field(
        default=DEFAULT_INSTANCE,
        min_length=1,
        description="Name of the ServeInstance (same namespace) that serves this application.",
        json_schema_extra=CRD_DEFAULT,
    )

    pickled_graph: PickledGraphReference | None = Field(
        default=None,
        description="An application deployed with serve.run (imperatively): the SHA-256 of its "
        "pickled graph, which the admin API stores in a Secret owned by this object; replicas "
        "load it instead of importing importPath. Set by the admin API only.",
    )

    @property
    def imperative(self) -> bool:
        """Deployed with ``serve.run`` (Ray's ``api_type: imperative``)."""
        return self.pickled_graph is not None

    def app_config(self, *, name: str) -> dict[str, Any]:
        """The application's config as the operator works with it (REST spelling, only the
        fields given): :meth:`to_rest`'s for a declarative application; for an imperative one
        what :meth:`kubeserve.schema.imperative.ImperativeApplicationSchema.stored_config`
        gives (``name``, ``route_prefix``, what else serve.run set, the graph's digest), so both
        backends derive the same replica versions from it. Raises pydantic's
        ``ValidationError`` when the spec breaks a REST rule."""
        if self.pickled_graph is None:
            return self.to_rest(name=name).as_given()
        body = self.model_dump(
            mode="json",
            by_alias=False,
            exclude_unset=True,
            exclude={"app_name", "instance", "pickled_graph"},
        )
        config: dict[str, Any] = {"name": name, "route_prefix": "/", **body}
        config[GRAPH_DIGEST_KEY] = self.pickled_graph.sha256
        return config

    @classmethod
    def from_imperative(
        cls, config: Mapping[str, Any], *, instance: str = DEFAULT_INSTANCE
    ) -> ServeApplicationSpecBase:
        """The spec of an application deployed with ``serve.run``: ``config`` as
        :meth:`~kubeserve.schema.imperative.ImperativeApplicationSchema.stored_config` gives it
        (:meth:`app_config` is its inverse)."""
        body = {k: v for k, v in config.items() if k not in ("name", GRAPH_DIGEST_KEY)}
        body["app_name"] = config["name"]
        body["pickled_graph"] = {"sha256": config[GRAPH_DIGEST_KEY]}
        if instance != DEFAULT_INSTANCE:
            body["instance"] = instance
        return cls.model_validate(body, by_name=True, by_alias=False)

    @model_validator(mode="after")
    def _one_source(self) -> ServeApplicationSpecBase:
        """The code is named by ``importPath`` or is a pickled graph, never both; an imperative
        application has only what serve.run sets."""
        if self.pickled_graph is None:
            if getattr(self, "import_path", None) is None:
                raise field_error("importPath or pickledGraph is required", "importPath")
            return self
        given = sorted(self.model_fields_set & set(_DECLARATIVE_ONLY))
        if given:
            fields = ", ".join(to_camel(name) for name in given)
            raise field_error(f"{fields} cannot be set with pickledGraph", to_camel(given[0]))
        return self

    def to_rest(self, *, name: str) -> ServeApplicationEntry:
        """The REST element of ``applications`` named ``name``, the application's Ray name.

        The Ray name is ``appName`` when set, else the object's ``metadata.name``, except for the
        single-application family's ``""`` (an annotation the admin API sets); the Kubernetes
        contract spells that rule once (``kubeserve.runtime.kubernetes.contract.application_name``)
        and its callers pass the result. Raises pydantic's ``ValidationError`` when the spec breaks
        a REST rule.
        """
        body = self.model_dump(
            mode="json", by_alias=False, exclude_unset=True, exclude={"app_name", "instance"}
        )
        return ServeApplicationEntry.model_validate({"name": name, **body})

    @classmethod
    def from_rest(
        cls, app: ServeApplicationSchema, *, instance: str = DEFAULT_INSTANCE
    ) -> ServeApplicationSpecBase:
        """The spec of a REST application (``host``/``port`` go to the instance, not here).

        ``appName`` is always set, so the object's name may be any valid Kubernetes name.
        """
        body = app.model_dump(mode="json", exclude_unset=True, exclude={"name", "host", "port"})
        body["app_name"] = app.name
        if instance != DEFAULT_INSTANCE:
            body["instance"] = instance
        return cls.model_validate(body, by_name=True, by_alias=False)


#: Spec fields only a declarative application has: serve.run sets none of them.
_DECLARATIVE_ONLY = ("import_path", "runtime_env", "deployments", "args", "autoscaling_policy")


def _rest_validators(rest: type[BaseModel]) -> dict[str, Any]:
    """The REST model's after-validators, re-attached to a spec model built from its fields."""
    decorators = rest.__pydantic_decorators__.model_validators
    return {
        name: model_validator(mode="after")(d.func)
        for name, d in decorators.items()
        if d.info.mode == "after"
    }


ServeApplicationSpec = create_model(  # type: ignore[call-overload]
    "ServeApplicationSpec",
    __base__=ServeApplicationSpecBase,
    __module__=__name__,
    __doc__=ServeApplicationSpecBase.__doc__,
    __validators__=_rest_validators(ServeApplicationSchema),
    **{
        **_cr_fields(ServeApplicationEntry, omit=frozenset({"name", "host", "port"})),
        # absent for an application deployed with serve.run (``pickledGraph``; see _one_source)
        "import_path": (
            ImportPath | None,
            Field(default=None, description="The application's import path (module:attribute)."),
        ),
    },
)


# --------------------------------------------------------------------------- ServeInstance spec


class ProxyTLS(CRModel):
    """``ServeInstance.spec.tls``: the proxies serve HTTPS from a Secret of the instance's
    namespace, mounted into every proxy pod and reloaded when it changes (a renewal reaches new
    connections; open ones go on)."""

    secret_name: str = Field(
        min_length=1,
        description="A Secret with tls.crt and tls.key (and ca.crt for client certificates), as "
        "a cert-manager Certificate or `kubectl create secret tls` writes it.",
    )
    require_client_certificates: bool = Field(
        default=False,
        description="Clients must present a certificate the Secret's ca.crt signed (Ray's "
        "http_options.ssl_ca_certs).",
    )


class InstanceProxy(CRModel):
    """``ServeInstance.spec.proxy``: how the instance's proxy pods serve."""

    data_path: DataPath | None = Field(
        default=None,
        description="native: the native data path (kubeserve-fastpath, in the kubeserve image) "
        "serves the requests it covers in front of the Python proxy (terminating spec.tls's "
        "HTTPS too) and hands the rest to it; python: the Python proxy serves every request. "
        "Unset: the operator's default (its --proxy-data-path, the chart's proxyDataPath; native "
        "unless changed, python in an image without kubeserve-fastpath).",
    )
    node_local_sockets: bool | None = Field(
        default=None,
        description="Proxies and handles reach the replicas on their own node through unix "
        "sockets in a directory of the node (a hostPath, /run/kubeserve/<namespace>/<instance>) "
        "instead of TCP across the pod network, which costs them and the replicas more CPU per "
        "request than the request's own work on a bridge CNI. Replica pods then run a root init "
        "container (CHOWN only) that hands the directory to the pods' user, so the namespace's "
        "admission (Pod Security privileged, any policy webhook) must admit them. Unset: the "
        "operator's choice (its --node-local-sockets, the chart's nodeLocalSockets): Auto, the "
        "default, asks the API server once per instance with a server-side dry run of such a "
        "pod and uses the sockets if it is admitted, TCP if not; status.nodeLocalSockets says "
        "which and why. true: always (pods a namespace refuses are not created, and the "
        "application's status says so); false: never.",
    )


class NodeSocketsStatus(CRModel):
    """``ServeInstance.status.nodeLocalSockets``: whether the instance's pods use node-local
    sockets, and why."""

    enabled: bool
    reason: str = Field(description="Who chose, and on what (the admission's refusal if any).")


class AccessLines(StrEnum):
    """Where the proxy and replica pods write their access lines (``GET /echo 200 1.2ms``)."""

    #: a rotated file in the pod (``/var/log/kubeserve/access.log``), as Ray's log directory
    FILE = "File"
    #: the container's output with the other records (``kubectl logs``)
    CONTAINER_OUTPUT = "ContainerOutput"


class InstanceLogs(CRModel):
    """``ServeInstance.spec.logs``: where the instance's pods write their logs."""

    access_lines: AccessLines = Field(
        default=AccessLines.FILE,
        description="File: proxies and replicas write access lines (one per request) to a file "
        "in the pod, /var/log/kubeserve/access.log, rotated at 16 MiB keeping 4 (an emptyDir of "
        "96Mi), as Ray writes them to its log directory; the container's output keeps the other "
        "records. ContainerOutput: with the records, in kubectl logs; the container runtime then "
        "writes every request's line into the kubelet's log itself (CPU on the node per "
        "request), and at a few thousand requests a second the kubelet's rotation (10 MiB by "
        "default) keeps only seconds of the records.",
        json_schema_extra=CRD_DEFAULT,
    )


class ServeInstanceSpecBase(CRModel):
    """``ServeInstance.spec``: the serving layer (REST ``ServeDeploySchema`` minus applications).

    Its existence means "the serving layer is running" in its namespace; usually one per namespace,
    named ``default``.
    """

    rest_model: ClassVar[type[BaseModel]] = ServeDeploySchema
    ray_name: ClassVar[str] = "ServeDeploySchema"
    #: the fields below that are not REST options (a REST PUT keeps what they hold)
    cr_only_fields: ClassVar[tuple[str, ...]] = (
        "image",
        "image_pull_policy",
        "tls",
        "proxy",
        "logs",
    )

    image: str = Field(
        default=DEFAULT_IMAGE,
        min_length=1,
        description="Container image of the proxy, replica and build pods (an application's "
        "runtimeEnv.imageUri overrides it for that application).",
        json_schema_extra=CRD_DEFAULT,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="imagePullPolicy of those pods; Kubernetes' default when unset."
    )
    tls: ProxyTLS | None = Field(
        default=None,
        description="Serve HTTPS on the proxies from a Secret (on Kubernetes instead of "
        "httpOptions.ssl_*, which name files on the operator's machine).",
    )
    proxy: InstanceProxy | None = Field(
        default=None, description="How the proxy pods serve (the data path)."
    )
    logs: InstanceLogs | None = Field(
        default=None, description="Where the proxy and replica pods write their logs."
    )

    def rest_options(self) -> dict[str, Any]:
        """The instance-level REST fields, as given (a ``ServeDeploySchema`` minus applications)."""
        return self.model_dump(
            mode="json",
            by_alias=False,
            exclude_unset=True,
            exclude=set(self.cr_only_fields),
        )

    def to_rest(self, applications: list[ServeApplicationEntry]) -> ServeDeploySchema:
        """The REST multi-application config of this instance and its applications."""
        apps = [a.as_given() for a in applications]
        return ServeDeploySchema.model_validate({**self.rest_options(), "applications": apps})

    @classmethod
    def from_rest(cls, config: ServeDeploySchema, **cr_only: Any) -> ServeInstanceSpecBase:
        """The spec of a REST config's instance-level fields; ``cr_only``: image, pull policy."""
        body = config.model_dump(mode="json", exclude_unset=True, exclude={"applications"})
        return cls.model_validate({**body, **cr_only}, by_name=True, by_alias=False)


ServeInstanceSpec = create_model(  # type: ignore[call-overload]
    "ServeInstanceSpec",
    __base__=ServeInstanceSpecBase,
    __module__=__name__,
    __doc__=ServeInstanceSpecBase.__doc__,
    **_cr_fields(ServeDeploySchema, omit=frozenset({"applications"})),
)


# --------------------------------------------------------------------------- status


class Condition(CRModel):
    """A Kubernetes condition (the shape of ``metav1.Condition``), read by ``kubectl wait``."""

    type: str = Field(min_length=1, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: NonNegativeInt | None = None


class ScalingDecisionEntry(CRModel):
    """The autoscaler's last change of a deployment's target (Ray's ``ScalingDecision``)."""

    timestamp_s: float
    reason: str = ""
    prev_num_replicas: NonNegativeInt = 0
    curr_num_replicas: NonNegativeInt = 0


class DeploymentStatusEntry(CRModel):
    """One serve deployment of an application: Ray's status values plus replica counts."""

    status: DeploymentStatus
    status_trigger: DeploymentStatusTrigger = DeploymentStatusTrigger.UNSPECIFIED
    message: str = ""
    replicas: NonNegativeInt = 0
    ready_replicas: NonNegativeInt = 0
    target_replicas: NonNegativeInt = 0
    #: the data plane's routing inputs: the Service whose EndpointSlices list the ready replicas,
    #: and the cap on requests in flight per replica
    service: str | None = None
    max_ongoing_requests: PositiveInt | None = None
    #: the callers' queue limit (-1: none) and their answer beyond it (``backpressure_config``)
    max_queued_requests: int | None = None
    backpressure_status: int | None = None
    retry_after_s: float | None = None
    #: the deployment's custom request router, as JSON (:class:`RequestRouterSpec` of
    #: ``kubeserve.runtime.wire``); absent: the built-in router
    request_router: str | None = None
    #: of an autoscaling deployment: why its target last changed
    last_scaling_decision: ScalingDecisionEntry | None = None


class ServeApplicationStatus(CRModel):
    """``ServeApplication.status``, written by the operator only.

    ``kopf`` is the operator framework's own state (handler progress), kept here rather than in
    annotations; its content is opaque.
    """

    app_status: ApplicationStatus | None = None
    message: str = ""
    ready_deployments: str | None = Field(
        default=None, description='Healthy deployments out of all, e.g. "2/3".'
    )
    replicas: str | None = Field(
        default=None,
        description='Ready replicas out of the target, all deployments together, e.g. "3/4".',
    )
    route_prefix: str | None = Field(default=None, description="The effective route prefix.")
    ingress_deployment: str | None = Field(
        default=None, description="The deployment that receives the application's HTTP traffic."
    )
    #: Ray's API-docs route of a FastAPI ingress; kubeserve serves none, so it stays unset (null)
    docs_path: str | None = None
    #: when the current spec was deployed: the admin API's PUT, else the operator's first sight of
    #: this generation; the admin API's ``last_deployed_time_s``
    last_deployed_time: datetime | None = None
    observed_generation: NonNegativeInt | None = None
    deployments: dict[str, DeploymentStatusEntry] = Field(default_factory=dict)
    conditions: list[Condition] = Field(default_factory=list)
    kopf: dict[str, Any] | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ServeApplicationStatus:
        """The status written on a ``ServeApplication`` object, read back through this model.

        Empty before the operator's first pass, and when what is there is not a status this
        model wrote (the CRD's schema keeps that from happening): readers then see "not
        reported yet" rather than fail.
        """
        try:
            return cls.model_validate(obj.get("status") or {})
        except ValidationError:
            return cls()


class ServeInstanceState(StrEnum):
    """Summary state of the serving layer, for ``kubectl get``; ``conditions`` carry details."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class ApplicationSummary(CRModel):
    """One application of an instance, keyed by application name in the instance status."""

    status: ApplicationStatus
    route_prefix: str | None = None
    message: str = ""


class ServeInstanceStatus(CRModel):
    """``ServeInstance.status``, written by the operator only; ``proxies`` keyed by node."""

    state: ServeInstanceState | None = None
    message: str = ""
    observed_generation: NonNegativeInt | None = None
    proxies: dict[str, cr_variant(ProxyDetails)] = Field(default_factory=dict)  # type: ignore[valid-type]
    applications: dict[str, ApplicationSummary] = Field(default_factory=dict)
    conditions: list[Condition] = Field(default_factory=list)
    node_local_sockets: NodeSocketsStatus | None = None
    kopf: dict[str, Any] | None = None
