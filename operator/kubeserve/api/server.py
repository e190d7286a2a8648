"""The admin REST API on the dashboard port: Ray Serve 2.60's two families, over any backend.

Handlers here only translate HTTP to :class:`~kubeserve.backends.protocol.Backend` calls: they read
and validate the body (every rule lives in :mod:`kubeserve.schema`), then call the backend. Nothing
is written unless the whole body is valid, so a bad request never loses accepted config.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib.metadata import version as _package_version
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from kubeserve.admin_client import APPLICATION_PATH
from kubeserve.api import dashboard
from kubeserve.api.errors import (
    BadRequest,
    Handler,
    PayloadTooLarge,
    UnsupportedMediaType,
    error_middleware,
)
from kubeserve.api.namespaces import (
    NAMESPACES_KEY,
    NAMESPACES_PATH,
    list_namespaces,
    namespace_backend,
    namespace_syntax,
    request_backend,
)
from kubeserve.api.openapi import Endpoint, QueryParameter, openapi_document
from kubeserve.api.security import AdminSecurity, route_path, security_middleware
from kubeserve.backends.protocol import (
    Backend,
    ConflictError,
    Namespaces,
    NotFoundError,
    SingleNamespace,
)
from kubeserve.control.details import details_json, single_app_status
from kubeserve.schema.body import decode_json_body, parse_body
from kubeserve.schema.config import ServeApplicationSchema, ServeDeploySchema
from kubeserve.schema.errors import ErrorDetail, SchemaError
from kubeserve.schema.imperative import (
    APPLICATION_NAME_SCHEMA,
    GraphTooLargeError,
    ImperativeApplicationSchema,
    check_application_name,
    graph_too_large,
)
from kubeserve.schema.namespaces import NAMESPACE_PREFIX
from kubeserve.schema.scaling import ScaleDeploymentRequest, ScaleDeploymentResponse
from kubeserve.schema.status import APIType, ServeInstanceDetails, ServeStatusSchema

#: The Ray version kubeserve's admin API is compatible with (the ``serve`` client checks it).
RAY_COMPATIBLE_VERSION = "2.60.0"
#: Largest accepted request body; a config this large is a mistake, not a deployment.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: The Prometheus text exposition format's media type (what ``GET /metrics`` answers).
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Where the OpenAPI document of the running server is served.
OPENAPI_PATH = "/api/serve/openapi.json"

BACKEND_KEY = web.AppKey("backend", Backend)
DEFAULT_HTTP_KEY = web.AppKey("default_http", dict)
OPENAPI_KEY = web.AppKey("openapi", dict)


def create_app(
    backend: Backend,
    default_http: dict[str, Any] | None = None,
    security: AdminSecurity | None = None,
    *,
    namespaces: Namespaces | None = None,
    middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The admin server; ``default_http`` overrides http_options of a serving layer started
    implicitly (by GET /api/serve/deployments/status); ``security`` turns on the bearer token
    and the Host check (off by default, as the operator runs it). ``namespaces`` are the
    instances ``/namespaces/<namespace>/...`` addresses (:mod:`kubeserve.api.namespaces`; by
    default ``backend``'s alone, as namespace ``default``). ``middlewares`` run inside the
    error mapping, before every handler: access control a backend brings (the operator's
    :class:`~kubeserve.backends.kubernetes.admin_auth.KubernetesAuthorizer`); they (and the look-up
    of the namespace's instance) are skipped for the dashboard's static files, which hold no data
    (:mod:`kubeserve.api.dashboard`; the page of any namespace is served), and for the backend's
    internal routes, whose callers (kubeserve's own processes and pods) sign their
    requests with the data plane's secret instead."""
    security = security or AdminSecurity()
    internal = backend.internal_routes()
    internal_paths = frozenset(r.path for r in internal if isinstance(r, web.RouteDef))
    token_exempt = {e.path for e in ENDPOINTS if e.open} | dashboard.OPEN_PATHS | internal_paths
    no_data = dashboard.OPEN_PATHS | internal_paths
    app = web.Application(
        middlewares=[
            error_middleware,
            namespace_syntax,
            security_middleware(security, token_exempt),
            *(_except_on(no_data, m) for m in (*middlewares, namespace_backend)),
        ],
        client_max_size=MAX_BODY_BYTES,
    )
    app[BACKEND_KEY] = backend
    app[NAMESPACES_KEY] = namespaces or SingleNamespace(backend)
    app[DEFAULT_HTTP_KEY] = default_http or {}
    app[OPENAPI_KEY] = openapi_document(
        ENDPOINTS,
        version=_package_version("kubeserve"),
        bearer_auth=security.auth_token is not None,
        namespaced=NAMESPACE_PREFIX,
    )
    # Each endpoint bare and under /namespaces/<namespace>/ (but the server's own health); and
    # each without its trailing slash (curl users type both), which is not documented.
    for prefix in ("", NAMESPACE_PREFIX):
        endpoints = [e for e in ENDPOINTS if not (prefix and e.open)]
        app.add_routes(web.route(e.method, prefix + e.path, e.handler) for e in endpoints)
        app.add_routes(
            web.route(e.method, prefix + e.path.rstrip("/"), e.handler)
            for e in endpoints
            if e.path.endswith("/")
        )
    app.add_routes(internal)
    app.add_routes(dashboard.dashboard_routes())
    return app


def _except_on(paths: frozenset[str], middleware: Middleware) -> Middleware:
    """``middleware``, but for requests routed to ``paths``, which go straight to their handler."""

    @web.middleware
    async def skipping(request: web.Request, handler: Handler) -> web.StreamResponse:
        if route_path(request) in paths:
            return await handler(request)
        return await middleware(request, handler)

    return skipping


async def ray_version(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "version": "kubeserve-" + _package_version("kubeserve"),
            "ray_version": RAY_COMPATIBLE_VERSION,
            "ray_commit": "kubeserve",
            "session_name": "kubeserve",
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """The instance's Prometheus metrics, where the backend gathers them (``kubeserve start``)."""
    body = await _backend(request).metrics()
    if body is None:
        raise NotFoundError(
            "this instance's metrics are scraped from its proxy and replica pods (their "
            "'metrics' port), not from the admin API"
        )
    return web.Response(body=body, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    """Open without a token, as in Ray's dashboard: probes carry none, and it reveals nothing."""
    return web.Response(text="success")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI_KEY])


async def _json_body(request: web.Request) -> Any:
    """The decoded JSON body of a PUT or POST, or a 400/413/415 that says what is wrong."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType(
            f"{request.method} bodies must be JSON: send 'Content-Type: application/json' "
            f"(got {request.content_type!r})"
        )
    raw = await request.read()
    # A thread: the largest accepted body takes about a second to check, and the discovery
    # long-polls of the data plane are served by this event loop.
    return await asyncio.to_thread(decode_json_body, raw)


def _backend(request: web.Request) -> Backend:
    return request_backend(request, request.app[BACKEND_KEY])


def _instance_options(config: ServeDeploySchema) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude={"applications"})


def _refuse(details: list[ErrorDetail]) -> None:
    """A 400 for what the schema accepts but the backend cannot run, at the fields' JSON paths."""
    if details:
        raise SchemaError(details)


def _app_config(app: ServeApplicationSchema) -> dict[str, Any]:
    """The application config as the client gave it (only set fields), with its name always."""
    body = app.as_given()
    body["name"] = app.name
    return body


def _deploy_body(body: Any) -> tuple[ServeDeploySchema, list[dict[str, Any]]]:
    """A multi-application body as the instance's model and each application's config."""
    config = parse_body(ServeDeploySchema, body)
    apps = [_app_config(app) for app in config.applications]
    for app in apps:  # the instance's http_options hold host and port (checked to agree)
        app.pop("host", None)
        app.pop("port", None)
    return config, apps


async def put_applications(request: web.Request) -> web.Response:
    # A thread, as the decoding: 1,000 applications take ~100 ms to validate, which the event
    # loop serving GETs and the data plane's discovery long-polls must not wait for.
    config, apps = await asyncio.to_thread(_deploy_body, await _json_body(request))
    backend = _backend(request)
    instance = _instance_options(config)
    _refuse(
        backend.instance_refusals(instance)
        + [
            {**detail, "loc": ["applications", i, *detail["loc"]]}
            for i, app in enumerate(apps)
            for detail in backend.refusals(app)
        ]
    )
    await backend.apply(instance, apps)
    return web.json_response({"applications": [app["name"] for app in apps]})


async def put_imperative_application(request: web.Request) -> web.Response:
    """``serve.run``: deploy the pickled application object as application ``name``; the other
    applications keep running (:meth:`~kubeserve.backends.protocol.Backend.apply_imperative`)."""
    name = check_application_name(request.match_info["name"])
    try:
        body = await _json_body(request)
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(graph_too_large((request.content_length or 0) * 3 // 4)) from None
    app = parse_body(ImperativeApplicationSchema, body)
    try:
        graph = app.graph_bytes()
    except GraphTooLargeError as exc:
        raise PayloadTooLarge(str(exc)) from None
    await _backend(request).apply_imperative(
        _serving_layer_defaults(request), app.stored_config(name, graph), graph
    )
    return web.json_response({"applications": [name]})


async def delete_application(request: web.Request) -> web.Response:
    """``serve.delete(name)``: remove one application of either kind; a no-op for an unknown one,
    as in Ray."""
    await _backend(request).delete_application(check_application_name(request.match_info["name"]))
    return web.json_response({})


def _serving_layer_defaults(request: web.Request) -> dict[str, Any]:
    """Instance options of a serving layer a request starts implicitly (``kubeserve start``'s
    ``http_options`` over Ray's defaults)."""
    defaults = _instance_options(ServeDeploySchema(applications=[]))
    defaults["http_options"].update(request.app[DEFAULT_HTTP_KEY])
    return defaults


async def get_applications(request: web.Request) -> web.Response:
    """Ray's ``?api_type=imperative|declarative`` (any case) keeps the applications deployed that
    way: ``imperative`` by ``serve.run``, ``declarative`` by a config. Another value is a 400, as
    in Ray."""
    api_type = request.query.get("api_type", "")
    wanted = api_type.lower()
    if api_type and wanted not in _API_TYPES:
        message = f"invalid api_type {api_type[:100]!r}: must be one of {', '.join(_API_TYPES)}"
        raise BadRequest(message, [{"loc": ["query", "api_type"], "msg": message}])
    details = await _backend(request).instance_details()
    if wanted:
        details.applications = {
            name: app for name, app in details.applications.items() if app.source == wanted
        }
    return web.Response(body=details_json(details), content_type="application/json")


async def delete_all(request: web.Request) -> web.Response:
    await _backend(request).shutdown()
    return web.json_response({})


async def put_single_app(request: web.Request) -> web.Response:
    app = parse_body(ServeApplicationSchema, await _json_body(request))
    instance = _instance_options(ServeDeploySchema(applications=[]))
    instance["http_options"].update(host=app.host, port=app.port)
    config = _app_config(app)
    config.pop("host", None)
    config.pop("port", None)
    backend = _backend(request)
    _refuse(backend.refusals(config))
    await backend.apply(instance, [config], single_app=app.as_given())
    return web.json_response({"applications": [app.name]})


async def get_single_app(request: web.Request) -> web.Response:
    backend = _backend(request)
    single = await backend.single_app_config()
    if single is not None:
        return web.json_response(single)
    apps = (await backend.instance_details()).applications
    if not apps:
        raise NotFoundError("no application is deployed")
    if len(apps) > 1:
        raise ConflictError(
            f"{len(apps)} applications run ({', '.join(sorted(apps))}); "
            "read them with GET /api/serve/applications/"
        )
    (app,) = apps.values()
    if app.deployed_app_config is None:
        raise NotFoundError(f"the application {app.name!r} has no valid config")
    return web.json_response(app.deployed_app_config.as_given())


async def scale_deployment(request: web.Request) -> web.Response:
    """Ray 2.60's external scaling endpoint: answered once the count is stored; the replicas
    follow asynchronously."""
    body = parse_body(ScaleDeploymentRequest, await _json_body(request))
    app, deployment = request.match_info["application"], request.match_info["deployment"]
    await _backend(request).scale_deployment(app, deployment, body.target_num_replicas)
    return web.json_response(ScaleDeploymentResponse().model_dump())


async def get_single_app_status(request: web.Request) -> web.Response:
    backend = _backend(request)
    await backend.ensure_running(_serving_layer_defaults(request))
    single = await backend.single_app_config()
    apps = (await backend.instance_details()).applications
    name = single.get("name", "") if single is not None else next(iter(apps), "")
    status = single_app_status(name, apps.get(name))
    return web.json_response(status.model_dump(mode="json"))


_API_TYPES = (APIType.IMPERATIVE.value, APIType.DECLARATIVE.value)
_DEPLOYED: dict[str, Any] = {
    "type": "object",
    "properties": {"applications": {"type": "array", "items": {"type": "string"}}},
    "required": ["applications"],
}
_NAMESPACES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "own": {"type": "string"},
        "namespaces": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["own", "namespaces"],
}
_VERSION: dict[str, Any] = {
    "type": "object",
    "properties": {
        key: {"type": "string"} for key in ("version", "ray_version", "ray_commit", "session_name")
    },
    "required": ["ray_version"],
}

#: Every operation of the admin API, as routed and as documented (``/api/serve/openapi.json``).
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/api/ray/version",
        ray_version,
        "Ray version this API is compatible with",
        response=_VERSION,
    ),
    Endpoint("GET", "/-/healthz", healthz, "Liveness: 'success'", text=True, open=True),
    Endpoint(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics of the proxy and replicas (Ray Serve's names)",
        text=True,
        errors=(404,),
    ),
    Endpoint("GET", OPENAPI_PATH, openapi, "This document"),
    Endpoint(
        "GET",
        NAMESPACES_PATH,
        list_namespaces,
        "The namespaces whose instance the caller may read; 'own' is the one the bare paths "
        "address (the dashboard's switcher)",
        response=_NAMESPACES,
    ),
    Endpoint(
        "PUT",
        "/api/serve/applications/",
        put_applications,
        "Deploy a multi-application config; the declarative applications it does not list are "
        "removed (those deployed with serve.run stay)",
        request=ServeDeploySchema,
        response=_DEPLOYED,
        errors=(409, 503),
    ),
    Endpoint(
        "GET",
        "/api/serve/applications/",
        get_applications,
        "The serving layer and every application (Ray's ServeInstanceDetails)",
        response=ServeInstanceDetails,
        errors=(503,),
        query=(
            QueryParameter(
                "api_type", "keep applications deployed this way (case-insensitive)", _API_TYPES
            ),
        ),
    ),
    Endpoint(
        "DELETE",
        "/api/serve/applications/",
        delete_all,
        "Shut down the serving layer and every application",
        errors=(503,),
    ),
    Endpoint(
        "PUT",
        APPLICATION_PATH,
        put_imperative_application,
        "Deploy one application imperatively (serve.run): the driver's pickled application "
        "object; the other applications keep running",
        request=ImperativeApplicationSchema,
        response=_DEPLOYED,
        errors=(409, 413, 503),
        path_schemas={"name": APPLICATION_NAME_SCHEMA},
    ),
    Endpoint(
        "DELETE",
        APPLICATION_PATH,
        delete_application,
        "Remove one application, deployed either way (serve.delete)",
        errors=(400, 503),
        path_schemas={"name": APPLICATION_NAME_SCHEMA},
    ),
    Endpoint(
        "PUT",
        "/api/serve/deployments/",
        put_single_app,
        "Deploy one application; it becomes the only one",
        request=ServeApplicationSchema,
        response=_DEPLOYED,
        errors=(409, 503),
    ),
    Endpoint(
        "GET",
        "/api/serve/deployments/",
        get_single_app,
        "The config of the one application, as sent",
        response=ServeApplicationSchema,
        errors=(404, 409, 503),
    ),
    Endpoint(
        "DELETE", "/api/serve/deployments/", delete_all, "Shut everything down", errors=(503,)
    ),
    Endpoint(
        "POST",
        "/api/v1/applications/{application}/deployments/{deployment}/scale",
        scale_deployment,
        "Set a deployment's replica count (applications with external_scaler_enabled)",
        request=ScaleDeploymentRequest,
        response=ScaleDeploymentResponse,
        errors=(404, 412, 503),
    ),
    Endpoint(
        "GET",
        "/api/serve/deployments/status",
        get_single_app_status,
        "Status of the one application; starts the serving layer if it is not running",
        response=ServeStatusSchema,
        errors=(503,),
    ),
)
