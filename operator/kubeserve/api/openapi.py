"""The admin API's OpenAPI 3.1 document, generated from the route table and the pydantic models.

Nothing here is written by hand per endpoint: :class:`Endpoint` rows (method, path, handler,
models) are what :func:`kubeserve.api.server.create_app` registers *and* what
:func:`openapi_document` describes, so a route cannot exist without its description. Request
bodies use the models' validation schemas (what a client may send), responses their
serialization schemas; both share ``components/schemas``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from kubeserve.api.errors import Handler

__all__ = ["Endpoint", "ErrorBody", "QueryParameter", "openapi_document"]

_REF_TEMPLATE = "#/components/schemas/{model}"


class ErrorLocation(BaseModel):
    """One problem: where (JSON path as the client spelled it, or a header or query name)."""

    loc: list[str | int]
    msg: str


class ErrorBody(BaseModel):
    """Every error answer: one line saying what is wrong, then each problem at its path."""

    error: str
    details: list[ErrorLocation]


@dataclass(frozen=True)
class QueryParameter:
    name: str
    description: str
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    """One operation of the admin API: how it is routed and how it is documented.

    ``response`` is a model or an inline JSON schema of the 200 body; ``text`` marks a text/plain
    answer. ``open`` operations need no token (see :mod:`kubeserve.api.security` for which and why).
    ``path_schemas`` give path parameters a JSON schema of their own (default: any string).
    """

    method: str
    path: str
    handler: Handler
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | dict[str, Any] | None = None
    query: tuple[QueryParameter, ...] = ()
    text: bool = False
    open: bool = False
    errors: tuple[int, ...] = ()
    path_schemas: Mapping[str, Any] = field(default_factory=dict)


def openapi_document(
    endpoints: Sequence[Endpoint], *, version: str, bearer_auth: bool, namespaced: str | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints``; ``bearer_auth`` adds the token requirement;
    ``namespaced`` is the prefix under which the same paths address one namespace's instance (a
    second server, whose variable is the namespace)."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    for endpoint in endpoints:
        if endpoint.request is not None:
            models.append((endpoint.request, "validation"))
        if isinstance(endpoint.response, type):
            models.append((endpoint.response, "serialization"))
    refs, definitions = models_json_schema(models, ref_template=_REF_TEMPLATE)
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation = _operation(endpoint, refs, bearer_auth)
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "kubeserve admin API",
            "version": version,
            "description": "Ray Serve 2.60 compatible admin API of kubeserve.",
        },
        "paths": paths,
        "components": {"schemas": definitions.get("$defs", {})},
    }
    if namespaced is not None:
        (variable,) = re.findall(r"{(\w+)}", namespaced)
        document["servers"] = [
            {"url": "/", "description": "the instance of the server's own namespace"},
            {
                "url": namespaced,
                "description": "the instance of another namespace (not /-/healthz)",
                "variables": {variable: {"default": "default", "description": "its namespace"}},
            },
        ]
    if bearer_auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document


def _operation(
    endpoint: Endpoint,
    refs: Mapping[tuple[Any, JsonSchemaMode], dict[str, Any]],
    bearer_auth: bool,
) -> dict[str, Any]:
    error = {"application/json": {"schema": refs[(ErrorBody, "serialization")]}}
    if endpoint.text:
        ok: dict[str, Any] = {"text/plain": {"schema": {"type": "string"}}}
    elif isinstance(endpoint.response, type):
        ok = {"application/json": {"schema": refs[(endpoint.response, "serialization")]}}
    else:
        ok = {"application/json": {"schema": endpoint.response or {"type": "object"}}}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok}}
    statuses = set(endpoint.errors)
    if endpoint.request is not None:
        statuses |= {400, 413, 415}
    if endpoint.query:
        statuses.add(400)
    if bearer_auth and not endpoint.open:
        statuses |= {401, 403}
    for status in sorted(statuses):
        responses[str(status)] = {"description": _REASONS[status], "content": error}
    operation: dict[str, Any] = {
        "operationId": f"{endpoint.method.lower()}_{endpoint.handler.__name__}",
        "summary": endpoint.summary,
        "responses": responses,
    }
    if endpoint.request is not None:
        schema = refs[(endpoint.request, "validation")]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": endpoint.path_schemas.get(name, {"type": "string"}),
        }
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    if endpoint.query:
        parameters += [
            {
                "name": q.name,
                "in": "query",
                "required": False,
                "description": q.description,
                "schema": {"type": "string", **({"enum": list(q.enum)} if q.enum else {})},
            }
            for q in endpoint.query
        ]
    if parameters:
        operation["parameters"] = parameters
    if bearer_auth and endpoint.open:
        operation["security"] = []
    return operation


_REASONS = {
    400: "Invalid request: each problem at its JSON path",
    401: "No bearer token",
    403: "Wrong bearer token, or a Host header that is not this server's (DNS rebinding)",
    404: "Nothing deployed, no such application or deployment, or a namespace not served",
    409: "Conflicts with the running state",
    412: "The application does not allow it (external_scaler_enabled is not true)",
    413: "Body over the size limit",
    415: "Body is not application/json",
    503: "The store of desired state is unavailable; retry",
}
