"""Every error the admin API answers, mapped to HTTP in this one place.

Error bodies are JSON: ``{"error": "<one line an operator can act on>", "details": [{"loc": [...],
"msg": "..."}]}``. Anything a client sent that is wrong is a 4xx; a 500 means a kubeserve bug and
is logged with its traceback, never shown to the client.

::

    ApiError                  (status, message, details)
     ├── BadRequest           400: malformed JSON, schema violations (details carry JSON paths)
     ├── UnsupportedMediaType 415: a PUT body that is not application/json
     ├── PayloadTooLarge      413: a pickled graph (serve.run's) over its limit (the backend's
     │                         own, lower limit: PayloadTooLargeError, also 413)
     ├── (aiohttp routing)    HTTPNotFound -> 404, HTTPMethodNotAllowed -> 405 with ``Allow``
     └── (backend errors)     ConflictError -> 409, NotFoundError -> 404, RejectedError -> 400,
                              PreconditionFailedError -> 412, UnavailableError -> 503,
                              InsufficientStorageError -> 507 (the store's disk is full)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from kubeserve.backends.protocol import (
    ConflictError,
    InsufficientStorageError,
    NotFoundError,
    PayloadTooLargeError,
    PreconditionFailedError,
    RejectedError,
    UnavailableError,
)
from kubeserve.schema.errors import ErrorDetail, SchemaError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    status = 500

    def __init__(self, message: str, details: list[ErrorDetail] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class BadRequest(ApiError):
    status = 400


class UnsupportedMediaType(ApiError):
    status = 415


class PayloadTooLarge(ApiError):
    status = 413


def error_response(
    status: int,
    message: str,
    details: list[Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        {"error": message, "details": details or []}, status=status, headers=headers
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, list(exc.details))
    except SchemaError as exc:
        return error_response(400, f"invalid config: {exc}", list(exc.details))
    except ConflictError as exc:
        return error_response(409, str(exc))
    except NotFoundError as exc:
        return error_response(404, str(exc))
    except RejectedError as exc:
        return error_response(400, str(exc))
    except PayloadTooLargeError as exc:
        return error_response(413, str(exc))
    except PreconditionFailedError as exc:
        return error_response(412, str(exc))
    except UnavailableError as exc:
        return error_response(503, str(exc))
    except InsufficientStorageError as exc:
        return error_response(507, str(exc))
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, f"request body too large: {exc.text or ''}".strip())
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return error_response(
            405,
            f"method {request.method} is not allowed on {request.path}: use {allowed}",
            headers={"Allow": exc.headers["Allow"]},
        )
    except web.HTTPNotFound:
        return error_response(404, f"no such endpoint: {request.method} {request.path}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except Exception:
        log.exception("internal error handling %s %s", request.method, request.path)
        return error_response(500, "internal error in kubeserve; see the server log")
