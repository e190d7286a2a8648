"""The body of an imperative deploy: ``serve.run(app, name=..., route_prefix=...)`` in a driver
script, ``PUT /api/kubeserve/applications/{name}``.

The application is not named by an ``import_path``: ``graph`` carries the application object
itself, pickled by the driver (:mod:`kubeserve.sdk.pickled_application`) and base64-encoded. What
``serve.run`` takes besides (``route_prefix``, ``logging_config``, ``external_scaler_enabled``)
follows the rules of the same fields in a config.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kubeserve.schema.config import LoggingConfig, Name, RestModel, RoutePrefix
from kubeserve.schema.errors import SchemaError
from kubeserve.schema.limits import MAX_PICKLED_GRAPH_BYTES

__all__ = [
    "APPLICATION_NAME_SCHEMA",
    "GRAPH_DIGEST_KEY",
    "GraphTooLargeError",
    "ImperativeApplicationSchema",
    "check_application_name",
    "graph_too_large",
]

#: The key of an imperative application's stored config holding the SHA-256 of its pickled
#: graph: what the build and the replicas' version depend on, as ``import_path`` for the others.
GRAPH_DIGEST_KEY = "pickled_graph_sha256"


class GraphTooLargeError(ValueError):
    """The pickled graph exceeds :data:`MAX_PICKLED_GRAPH_BYTES` (the API's 413)."""


class ImperativeApplicationSchema(RestModel):
    route_prefix: RoutePrefix | None = "/"
    logging_config: LoggingConfig | None = None
    external_scaler_enabled: bool = False
    #: the pickled application graph, base64 (standard alphabet, padded)
    graph: str

    def graph_bytes(self) -> bytes:
        """The pickled graph; :class:`SchemaError` at ``graph`` when it is not base64,
        :class:`GraphTooLargeError` when it exceeds the limit."""
        if len(self.graph) > 4 * (MAX_PICKLED_GRAPH_BYTES + 2) // 3:
            raise GraphTooLargeError(graph_too_large(len(self.graph) * 3 // 4))
        try:
            data = base64.b64decode(self.graph, validate=True)
        except (binascii.Error, ValueError):
            message = "graph must be the pickled application, base64-encoded"
            raise SchemaError([{"loc": ["graph"], "msg": message}]) from None
        if len(data) > MAX_PICKLED_GRAPH_BYTES:
            raise GraphTooLargeError(graph_too_large(len(data)))
        if not data:
            raise SchemaError([{"loc": ["graph"], "msg": "graph is empty"}])
        return data

    def stored_config(self, name: str, data: bytes) -> dict[str, Any]:
        """The config kept for the application: the fields given, its name and the digest of
        ``data`` (never the graph itself, which is stored beside it)."""
        config = self.as_given()
        config.pop("graph", None)
        config["name"] = name
        config.setdefault("route_prefix", "/")
        config[GRAPH_DIGEST_KEY] = hashlib.sha256(data).hexdigest()
        return config


def graph_too_large(
    size: int, limit: int = MAX_PICKLED_GRAPH_BYTES, reason: str = "MAX_PICKLED_GRAPH_BYTES"
) -> str:
    """The 413's message: ``size`` over ``limit`` (``reason``: where the limit comes from)."""
    return (
        f"the pickled application graph is about {size} bytes, over the limit of "
        f"{limit} bytes ({_size(limit)}, {reason}): load large objects (model weights, data) in "
        "the deployment's constructor instead of passing them to .bind()"
    )


def _size(limit: int) -> str:
    mib = limit / (1024 * 1024)
    return f"{mib:g} MiB" if limit % (1024 * 1024) == 0 else f"{limit / 1024:g} KiB"


_NAME: TypeAdapter[str] = TypeAdapter(Name)
#: The JSON schema of the ``{name}`` in the path (the admin API's OpenAPI document).
APPLICATION_NAME_SCHEMA: dict[str, Any] = {**_NAME.json_schema(), "minLength": 1}


def check_application_name(name: str) -> str:
    """``name`` (from a URL path) if it is a valid application name; else a 400 at ``name``."""
    try:
        valid = _NAME.validate_python(name)
    except ValidationError as err:
        raise SchemaError([{"loc": ["name"], "msg": err.errors()[0]["msg"]}]) from None
    if not valid:
        raise SchemaError([{"loc": ["name"], "msg": "the application name must not be empty"}])
    return valid
