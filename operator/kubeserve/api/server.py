"""The admin REST API on the dashboard port: Ray Serve 2.60's two families, over any backend.

Handlers here only translate HTTP to :class:`~kubeserve.backends.protocol.Backend` calls: they read
and validate the body (every rule lives in :mod:`kubeserve.schema`), then call the backend. Nothing
is written unless the whole body is valid, so a bad request never loses accepted config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.metadata import version as _package_version
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from kubeserve.api.errors import BadRequest, UnsupportedMediaType, error_middleware, error_response
from kubeserve.backends.protocol import Backend, ConflictError, NotFoundError
from kubeserve.schema.config import ServeApplicationSchema, ServeDeploySchema
from kubeserve.schema.errors import parse_body

#: The Ray version kubeserve's admin API is compatible with (the ``serve`` client checks it).
RAY_COMPATIBLE_VERSION = "2.60.0"
#: Largest accepted request body; a config this large is a mistake, not a deployment.
MAX_BODY_BYTES = 8 * 1024 * 1024

BACKEND_KEY = web.AppKey("backend", Backend)
DEFAULT_HTTP_KEY = web.AppKey("default_http", dict)


def create_app(
    backend: Backend,
    default_http: dict[str, Any] | None = None,
    *,
    middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The admin server; ``default_http`` overrides http_options of a serving layer started
    implicitly (by GET /api/serve/deployments/status). ``middlewares`` run inside the error
    mapping, before every handler: access control a backend brings (the operator's
    :class:`~kubeserve.backends.kubernetes.admin_auth.KubernetesAuthorizer`)."""
    app = web.Application(
        middlewares=[error_middleware, *middlewares], client_max_size=MAX_BODY_BYTES
    )
    app[BACKEND_KEY] = backend
    app[DEFAULT_HTTP_KEY] = default_http or {}
    routes = [
        web.get("/api/ray/version", ray_version),
        web.get("/-/healthz", healthz),
        web.put("/api/serve/applications/", put_applications),
        web.get("/api/serve/applications/", get_applications),
        web.delete("/api/serve/applications/", delete_all),
        web.put("/api/serve/deployments/", put_single_app),
        web.get("/api/serve/deployments/", get_single_app),
        web.delete("/api/serve/deployments/", delete_all),
        web.get("/api/serve/deployments/status", get_single_app_status),
    ]
    # The same endpoints without the trailing slash (curl users type both).
    routes += [
        web.route(r.method, r.path.rstrip("/"), r.handler)
        for r in list(routes)
        if isinstance(r, web.RouteDef) and r.path.endswith("/")
    ]
    app.add_routes(routes)
    app.add_routes(backend.internal_routes())
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def create_health_app() -> web.Application:
    """Only the health endpoint (the operator's admin API before its backend is wired)."""
    app = web.Application(middlewares=[error_middleware])
    app.add_routes([web.get("/-/healthz", healthz)])
    return app


async def not_found(request: web.Request) -> web.Response:
    return error_response(404, f"no such endpoint: {request.method} {request.path}")


async def ray_version(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "version": "kubeserve-" + _package_version("kubeserve"),
            "ray_version": RAY_COMPATIBLE_VERSION,
            "ray_commit": "kubeserve",
            "session_name": "kubeserve",
        }
    )


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="success")


async def _json_body(request: web.Request) -> Any:
    """The decoded JSON body of a PUT, or a 400/413/415 that says what is wrong."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType(
            f"PUT bodies must be JSON: send 'Content-Type: application/json' "
            f"(got {request.content_type!r})"
        )
    raw = await request.read()
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            [{"loc": [], "msg": f"malformed JSON: {exc.msg} (char {exc.pos})"}],
        ) from None


def _backend(request: web.Request) -> Backend:
    return request.app[BACKEND_KEY]


def _instance_options(config: ServeDeploySchema) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude={"applications"})


def _app_config(app: ServeApplicationSchema) -> dict[str, Any]:
    """The application config as the client gave it (only set fields), with its name always."""
    body = app.model_dump(mode="json", exclude_unset=True)
    body["name"] = app.name
    return body


async def put_applications(request: web.Request) -> web.Response:
    config = parse_body(ServeDeploySchema, await _json_body(request))
    apps = [_app_config(app) for app in config.applications]
    for app in apps:  # the instance's http_options hold host and port (checked to agree)
        app.pop("host", None)
        app.pop("port", None)
    await _backend(request).apply(_instance_options(config), apps)
    return web.json_response({"applications": [app["name"] for app in apps]})


async def get_applications(request: web.Request) -> web.Response:
    return web.json_response(await _backend(request).instance_details())


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
    await _backend(request).apply(
        instance, [config], single_app=app.model_dump(mode="json", exclude_unset=True)
    )
    return web.json_response({"applications": [app.name]})


async def get_single_app(request: web.Request) -> web.Response:
    backend = _backend(request)
    single = await backend.single_app_config()
    if single is not None:
        return web.json_response(single)
    apps = (await backend.instance_details()).get("applications", {})
    if not apps:
        raise NotFoundError("no application is deployed")
    if len(apps) > 1:
        raise ConflictError(
            f"{len(apps)} applications run ({', '.join(sorted(apps))}); "
            "read them with GET /api/serve/applications/"
        )
    (app,) = apps.values()
    return web.json_response(app["deployed_app_config"])


async def get_single_app_status(request: web.Request) -> web.Response:
    backend = _backend(request)
    defaults = _instance_options(ServeDeploySchema(applications=[]))
    defaults["http_options"].update(request.app[DEFAULT_HTTP_KEY])
    await backend.ensure_running(defaults)
    single = await backend.single_app_config()
    apps: dict[str, Any] = (await backend.instance_details()).get("applications", {})
    name = single.get("name", "") if single is not None else next(iter(apps), "")
    app = apps.get(name)
    if app is None:
        return web.json_response(
            {
                "name": name,
                "app_status": {"status": "NOT_STARTED", "message": "", "deployment_timestamp": 0},
                "deployment_statuses": [],
            }
        )
    return web.json_response(
        {
            "name": name,
            "app_status": {
                "status": app["status"],
                "message": app["message"],
                "deployment_timestamp": app["last_deployed_time_s"],
            },
            "deployment_statuses": [
                {"name": d["name"], "status": d["status"], "message": d["message"]}
                for d in app["deployments"].values()
            ],
        }
    )
