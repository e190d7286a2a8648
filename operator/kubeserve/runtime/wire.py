"""The data plane's wire contract: what controller, proxies, replicas and handles say to each other.

Replica protocol (HTTP/1.1 keep-alive on the replica's own host:port, every connection behind the
handshake of :mod:`kubeserve.runtime.channel`, whose role fixes what the connection carries):

* on an ``INGRESS`` connection (a proxy's) every request is user traffic for the deployment's HTTP
  ingress, whatever its path (the proxy forwards the original request line, headers and body
  unchanged); the endpoints below exist only on ``CONTROL`` connections:
* ``GET  /-/healthz``      runs the user's ``check_health()``; 200 when healthy, 503 with the error
  text;
* ``POST /-/reconfigure``  body: JSON ``{"user_config": ...}``; runs ``reconfigure``; 200 when
  applied, 500 with the error text when the user's hook raised;
* ``GET  /-/metrics``      Prometheus text: ``kubeserve_replica_ongoing_requests`` and friends;
* ``POST /-/call/<method>`` a handle call: body is ``encode_call(args, kwargs)``, response body is
  ``encode_result(value)`` with status 200, or ``encode_error(exc)`` with status 500 (``exc`` a
  :class:`~kubeserve.sdk.ray_errors.RayTaskError` holding the user's exception as its cause);
* ``POST /-/stream/<method>`` a streamed handle call of a generator method: same body; a 200
  answer's chunked body is a sequence of :func:`encode_frame` frames, one ``ITEM`` per value the
  generator yields as it yields it, then ``END``, or ``ERROR`` with the exception. A call of the
  wrong kind (a generator without streaming, or streaming a plain method) fails with ``TypeError``
  as in Ray Serve.

Discovery: ``GET {controller}/-/snapshot?version=N&timeout=S`` long-polls the controller: it answers
at once when its snapshot version differs from ``N`` and otherwise when it changes or ``S`` seconds
pass. The answer is a :class:`Snapshot`; proxies build their route table and routers from it,
handles their routers.

Discovery requests carry a signature of the data-plane secret
(:func:`kubeserve.runtime.channel.sign_request`); the controller answers nobody else.

Handle calls are encoded with pickle: both ends are processes of one kubeserve instance running the
same user code, and pickle carries arbitrary Python values compactly. Nothing is ever unpickled from
a peer that has not proved the instance's secret: the handshake comes before the first HTTP byte.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:  # a replica never loads the control layer for this
    from kubeserve.control.effective_config import EffectiveDeployment

#: ``GET``: 200 with :func:`health_answer` when the user's ``check_health`` passes, else 503.
HEALTHZ_PATH = "/-/healthz"
#: ``POST {"user_config": ...}``: apply it (a no-op when its version is the one applied); 200 with
#: :func:`health_answer`.
RECONFIGURE_PATH = "/-/reconfigure"
METRICS_PATH = "/-/metrics"
CALL_PREFIX = "/-/call/"
STREAM_PREFIX = "/-/stream/"
#: ``POST /-/duplex/<method>``, a chunked body of frames: the first an :func:`encode_call` (its
#: options say ``"unary"`` for one answer), then one :data:`FRAME_ITEM` per input message until the
#: body ends. Dispatched when its head arrives, so the method reads its input while answering; the
#: answer is framed as a stream's (a gRPC client-streaming or bidirectional call).
DUPLEX_PREFIX = "/-/duplex/"
SNAPSHOT_PATH = "/-/snapshot"
#: ``GET``: 200 with the JSON object the deployment's ``record_routing_stats()`` returned, 404 when
#: it has no such method, 500 with the error text when it raised (polled by custom routers).
ROUTING_STATS_PATH = "/-/routing-stats"
#: ``GET /-/request-router/<quoted import path>``: 200 with the class at that path pickled by
#: value (its module's code included), for callers that run without the application's code
#: (:mod:`kubeserve.runtime.custom_router`); 404 with the error text when it cannot be loaded.
REQUEST_ROUTER_PREFIX = "/-/request-router/"
#: ``GET {controller}/-/load?source=ID&queued=JSON`` (signed like discovery): a caller (proxy,
#: handle) reports ``{deployment key: requests waiting for a replica}``; the autoscaler adds them
#: to the replicas' ongoing requests.
LOAD_PATH = "/-/load"
#: ``POST`` one request of :mod:`kubeserve.runtime.autoscaling_policy`'s protocol (JSON) to an
#: application's policy host (``kubeserve policy-host``); 200 with its answer (JSON).
AUTOSCALING_POLICY_PATH = "/-/autoscaling-policy"


def health_answer(user_config_version: str, route_prefix: str = "") -> bytes:
    """A replica's answer to a health check or a reconfigure: the version of the ``user_config``
    it applied (:func:`kubeserve.control.user_config.user_config_version`) and the route prefix
    its ingress serves under (what ASGI apps see in ``root_path``; "" for none)."""
    return json.dumps(
        {"status": "ok", "user_config_version": user_config_version, "route_prefix": route_prefix}
    ).encode()


def applied_route_prefix(answer: bytes) -> str | None:
    """The route prefix in a :func:`health_answer`; None when it names none."""
    try:
        prefix = json.loads(answer).get("route_prefix")
    except (ValueError, AttributeError):
        return None
    return prefix if isinstance(prefix, str) else None


def applied_user_config(answer: bytes) -> str | None:
    """The ``user_config`` version in a :func:`health_answer`; None when it names none."""
    try:
        version = json.loads(answer).get("user_config_version")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


#: Header of a replica's 503 to a request it never started (it is shutting down): the request
#: provably did not run, so its caller may send it to another replica. Only such answers are ever
#: re-sent; a request a replica may have started is never run twice.
UNSERVED_HEADER = "x-kubeserve-unserved"
#: The :data:`UNSERVED_HEADER` value of a replica already running ``max_ongoing_requests``
#: requests (from all its callers together): the caller waits for a slot and tries again, on
#: another replica if one has room. Other values (``shutting-down``) mean "try another replica".
UNSERVED_AT_CAPACITY = "at-capacity"

#: Header of a replica's answer to a request that named a multiplexed model: the models the
#: replica holds once it answered, most recently used first, percent-encoded, comma-separated
#: (:func:`encode_models`). Every caller's router learns where models are from its own traffic
#: (:mod:`kubeserve.runtime.router`); the proxy strips it from what its client gets.
MODELS_HEADER = "x-kubeserve-models"
#: Model ids a replica names in :data:`MODELS_HEADER` at most (the most recently used ones), and
#: so that a caller keeps per replica: the header and the routers' tables stay small.
MODELS_SHOWN = 32

#: Environment variable carrying the JSON :class:`ReplicaConfig` of a replica process (the
#: Kubernetes backend's pod templates, whose config never holds ``user_config``).
REPLICA_CONFIG_ENV = "KUBESERVE_REPLICA_CONFIG"
#: Environment variable naming an inherited file descriptor holding the JSON :class:`ReplicaConfig`
#: (the local backend: ``user_config`` can be any size, and an environment variable past ~128 KiB
#: fails with E2BIG; an in-memory file, so that a replica starts on a full disk). A replica reads
#: and closes it when set, else reads :data:`REPLICA_CONFIG_ENV`.
REPLICA_CONFIG_FD_ENV = "KUBESERVE_REPLICA_CONFIG_FD"
#: Environment variable with the controller's base URL (``http://host:port``), for discovery.
CONTROLLER_URL_ENV = "KUBESERVE_CONTROLLER_URL"


class ReplicaEndpoint(TypedDict):
    replica_id: str
    host: str
    port: int


class DeploymentEndpoints(TypedDict):
    """The RUNNING replicas of one deployment and the cap on requests in flight per replica."""

    max_ongoing_requests: int
    replicas: list[ReplicaEndpoint]
    #: requests each caller may hold waiting for a replica (Ray's ``max_queued_requests``);
    #: -1 or absent: no limit of the deployment's own
    max_queued_requests: NotRequired[int]
    #: the proxy's answer beyond ``max_queued_requests`` (``backpressure_config``): 503 or 429,
    #: and the ``Retry-After`` seconds (absent: no header)
    backpressure_status: NotRequired[int]
    retry_after_s: NotRequired[float]
    #: why no replica is coming (:func:`no_replica_coming`); while ``replicas`` is empty, callers
    #: are refused at once (503 with ``Retry-After``) instead of waiting for one
    unavailable: NotRequired[str]
    #: the deployment's custom request router (absent: kubeserve's built-in policy)
    request_router: NotRequired[RequestRouterSpec]


class RequestRouterSpec(TypedDict):
    """A deployment's custom ``request_router_config``, as its callers need it."""

    request_router_class: str
    request_router_kwargs: dict[str, Any]
    request_routing_stats_period_s: float
    request_routing_stats_timeout_s: float
    initial_backoff_s: float
    backoff_multiplier: float
    max_backoff_s: float


def request_router_spec(config: EffectiveDeployment) -> RequestRouterSpec | None:
    """The custom router of a deployment, or None when it uses the built-in policy."""
    path = config.custom_request_router
    if path is None:
        return None
    merged = config.as_dict()["request_router_config"]  # Ray's defaults under what was given
    return {
        "request_router_class": path,
        "request_router_kwargs": dict(merged["request_router_kwargs"] or {}),
        "request_routing_stats_period_s": float(merged["request_routing_stats_period_s"]),
        "request_routing_stats_timeout_s": float(merged["request_routing_stats_timeout_s"]),
        "initial_backoff_s": float(merged["initial_backoff_s"]),
        "backoff_multiplier": float(merged["backoff_multiplier"]),
        "max_backoff_s": float(merged["max_backoff_s"]),
    }


#: The ``Retry-After`` of a refusal because no replica is coming: the controller keeps retrying
#: a failed deployment's starts (backing off), and a client may try again as often.
UNAVAILABLE_RETRY_AFTER_S = 10.0


def no_replica_coming(
    app: str, app_status: str | None, deployment: str, deployment_status: str | None
) -> str | None:
    """Why callers of ``deployment`` should not wait for a replica (None: one may come).

    A ``DEPLOY_FAILED`` deployment's replicas failed to start every time and the controller only
    retries them backing off; the reason names the application's state. It says nothing of the
    error itself (an exception's text may hold secrets; the admin API shows it).
    """
    if deployment_status != "DEPLOY_FAILED":
        return None
    return (
        f"application {app!r} is {app_status or 'DEPLOY_FAILED'}: the replicas of its deployment "
        f"{deployment!r} failed to start (its status in the admin API says why)"
    )


class Route(TypedDict):
    route_prefix: str
    app: str
    deployment: str


class ProxyTimeouts(TypedDict):
    """The serving layer's ``http_options`` timeouts, which a running proxy applies live."""

    request_timeout_s: float | None
    keep_alive_timeout_s: float


class Snapshot(TypedDict):
    version: int
    routes: list[Route]
    #: keyed by :func:`deployment_key`
    deployments: dict[str, DeploymentEndpoints]
    #: the local controller's (absent elsewhere: a proxy keeps the timeouts it was started with)
    proxy_timeouts: NotRequired[ProxyTimeouts]


class ReplicaConfig(TypedDict):
    """What a replica process needs to know at start-up (in the descriptor named by
    ``KUBESERVE_REPLICA_CONFIG_FD``, else in ``KUBESERVE_REPLICA_CONFIG``)."""

    app: str
    deployment: str
    import_path: str
    replica_id: str
    user_config: Any
    max_ongoing_requests: int
    graceful_shutdown_wait_loop_s: float
    graceful_shutdown_timeout_s: float
    #: With ``probe_port``: the replica runs ``check_health`` itself every
    #: ``health_check_period_s`` (each run limited to ``health_check_timeout_s``) and answers
    #: unauthenticated ``GET /-/healthz`` on ``probe_port`` with the last result (see
    #: :mod:`kubeserve.runtime.replica.probe`); the kubelet probes it. Absent: no probe listener.
    probe_port: NotRequired[int]
    #: After SIGTERM, how long the replica goes on taking requests before it drains, while its
    #: callers learn that it leaves (discovery lags behind the signal on Kubernetes); 0 if absent
    leave_delay_s: NotRequired[float]
    health_check_period_s: NotRequired[float]
    health_check_timeout_s: NotRequired[float]
    #: :meth:`kubeserve.runtime.limits.RequestLimits.to_mapping`; the defaults when absent
    request_limits: NotRequired[dict[str, Any]]
    #: The application's ``args`` for an application builder ({} or absent: none).
    app_args: NotRequired[dict[str, Any]]
    #: An application deployed with ``serve.run``: its graph as the driver pickled it (see
    #: :mod:`kubeserve.sdk.pickled_application`), base64; the replica loads it instead of
    #: importing ``import_path`` (then ""). Absent: a declarative application.
    app_graph: NotRequired[str]
    #: The same graph as a file the replica reads (on Kubernetes: the mounted Secret holding
    #: it), when ``app_graph`` is absent.
    app_graph_file: NotRequired[str]
    #: The application's route prefix: an ASGI ingress sees it as ``root_path``, as in Ray Serve
    #: (absent or "/": none).
    route_prefix: NotRequired[str | None]
    #: ``http_options.root_path``: where a reverse proxy in front, which strips it, mounts the
    #: instance; an ASGI ingress sees it before the route prefix in ``root_path`` and before the
    #: request's path in ``path``, as Ray's proxy (uvicorn) presents it. Absent: none.
    http_root_path: NotRequired[str]
    #: Ray's ``logging_config`` in force for the deployment (the deployment's, else the
    #: application's; absent: the decorator's, else Ray's defaults)
    logging_config: NotRequired[dict[str, Any]]
    #: the instance's ``tracing_config`` when it enables tracing (:mod:`kubeserve.runtime.
    #: tracing`); absent: no tracing, and OpenTelemetry never loaded
    tracing_config: NotRequired[dict[str, Any]]
    #: the deployment's custom ``request_router_class``: the replica loads it at start-up (a
    #: class that cannot be loaded fails the replica, and so the deploy) and serves it to its
    #: callers (:data:`REQUEST_ROUTER_PREFIX`). Absent: the built-in router.
    request_router_class: NotRequired[str]


class QueueLimits(TypedDict, total=False):
    """The queue fields of :class:`DeploymentEndpoints`."""

    max_queued_requests: int
    backpressure_status: int
    retry_after_s: float


def queue_limits(config: EffectiveDeployment) -> QueueLimits:
    """The queue fields of a deployment's endpoints, from its effective config."""
    limits: QueueLimits = {"max_queued_requests": config.max_queued_requests or -1}
    backpressure = config.backpressure_config or {}
    if backpressure.get("status_code"):
        limits["backpressure_status"] = int(backpressure["status_code"])
    if backpressure.get("retry_after_s") is not None:
        limits["retry_after_s"] = float(backpressure["retry_after_s"])
    return limits


def deployment_key(app: str, deployment: str) -> str:
    """The one spelling of a deployment's identity across the data plane."""
    return f"{app}#{deployment}"


def split_deployment_key(key: str) -> tuple[str, str]:
    """``(application, deployment)`` of a :func:`deployment_key`."""
    app, _, deployment = key.partition("#")
    return app, deployment


def parse_queued(text: str) -> dict[str, int]:
    """The ``queued`` field of a load report (``{deployment key: requests waiting}`` as JSON);
    ``ValueError`` when it is not a JSON object of counts."""
    try:
        queued = json.loads(text)
        counts = {str(key): int(n) for key, n in queued.items()}
    except (ValueError, TypeError, AttributeError):
        raise ValueError("queued must be a JSON object of counts") from None
    if any(n < 0 for n in counts.values()):
        raise ValueError("queued counts must not be negative")
    return counts


def parse_metrics(text: str) -> dict[str, float]:
    """``{metric name: value}`` of a Prometheus exposition with one series per name (a replica's
    ``/-/metrics``); labels are dropped, comments and unparsable lines skipped. Lines end at a
    line feed only, as in the text format (a carriage return is no line end there)."""
    values: dict[str, float] = {}
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.partition("{")[0].strip()
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


def encode_models(model_ids: Sequence[str]) -> str:
    """The :data:`MODELS_HEADER` value naming ``model_ids`` (the first :data:`MODELS_SHOWN`): each
    id's UTF-8 percent-encoded (so commas, spaces and any character survive), ASCII throughout."""
    from urllib.parse import quote  # (only multiplexed deployments name models)

    return ",".join(
        quote(model_id, safe="", errors="surrogateescape") for model_id in model_ids[:MODELS_SHOWN]
    )


def decode_models(value: bytes) -> frozenset[str]:
    """The model ids a :data:`MODELS_HEADER` value names (at most :data:`MODELS_SHOWN`), spelled
    as the replica's user code saw them."""
    if not value:
        return frozenset()
    from urllib.parse import unquote

    parts = value.decode("latin-1").split(",", MODELS_SHOWN)[:MODELS_SHOWN]
    return frozenset(unquote(part, errors="surrogateescape") for part in parts if part)


def encode_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any] | None = None
) -> bytes:
    """A call's arguments, and its options (``model_id``: the multiplexed model) when any."""
    import pickle  # at the first call: a proxy, which pickles nothing, never imports it

    call = (args, kwargs, options) if options else (args, kwargs)
    return pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)


def decode_call(body: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args, kwargs, _ = decode_call_with_options(body)
    return args, kwargs


def decode_call_with_options(
    body: bytes,
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    import pickle

    call = pickle.loads(body)
    options = call[2] if len(call) > 2 else {}
    return tuple(call[0]), dict(call[1]), dict(options)


#: Frame kinds of a streamed handle call's answer.
FRAME_ITEM = b"I"
FRAME_END = b"D"
FRAME_ERROR = b"E"
_FRAME_HEAD = struct.Struct(">cI")


def encode_frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame: kind (1 byte), payload length (4 bytes, big-endian), payload."""
    return _FRAME_HEAD.pack(kind, len(payload)) + payload


class FrameReader:
    """Splits a byte stream cut anywhere back into ``(kind, payload)`` frames."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        buffer = self._buffer + data if self._buffer else data
        frames: list[tuple[bytes, bytes]] = []
        size = _FRAME_HEAD.size
        start, end = 0, len(buffer)
        while end - start >= size:  # an offset, not slices: a write may carry many frames
            kind, length = _FRAME_HEAD.unpack_from(buffer, start)
            stop = start + size + length
            if stop > end:
                break
            frames.append((kind, buffer[start + size : stop]))
            start = stop
        self._buffer = buffer[start:] if start else buffer
        return frames


def encode_result(value: Any) -> bytes:
    import pickle

    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decode_result(body: bytes) -> Any:
    import pickle

    return pickle.loads(body)


#: The first byte of a gRPC method's answer (each item, for a stream) from the replica: the
#: message follows as the method serialized it, which the proxy sends on as is (no pickle either
#: way); or, when the method changed its ``grpc_context``, a pickle of (context, message).
GRPC_MESSAGE = b"M"
GRPC_WITH_CONTEXT = b"C"


def encode_grpc_answer(context: Any, message: bytes) -> bytes:
    """``message`` (serialized), with ``context`` when the method changed it (else None)."""
    if context is None:
        return GRPC_MESSAGE + message
    import pickle

    return GRPC_WITH_CONTEXT + pickle.dumps((context, message), protocol=pickle.HIGHEST_PROTOCOL)


def decode_grpc_answer(body: bytes) -> tuple[Any, bytes]:
    """The (context or None, message) of :func:`encode_grpc_answer`."""
    if body[:1] == GRPC_MESSAGE:
        return None, body[1:]
    import pickle

    context, message = pickle.loads(memoryview(body)[1:])
    return context, message


def encode_error(exc: BaseException) -> bytes:
    """An exception raised by user code, shipped back to the caller of a handle."""
    import pickle

    try:
        return pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # unpicklable exception: keep its type name and text
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
