"""Validation errors as the admin API reports them.

The API answers every invalid body with HTTP 400 and a list of details, each naming the offending
field by its JSON path *as the client spelled it* (for example
``["applications", 0, "deployments", 1, "max_concurrent_queries"]``), so a user can find the line
in their YAML. Pydantic already reports locations by alias; this module adds two things:

- cross-field rules (uniqueness, "give one spelling, not both", min <= max) are raised from model
  validators, whose location is the *model*; they carry the rest of the path in the error context
  (:func:`field_error`) and :func:`validation_details` appends it;
- messages are cleaned of pydantic's prefixes and documentation URLs.

Exception hierarchy::

    ValueError
     └── SchemaError        a body that does not match its model; ``.details`` lists every problem
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

__all__ = [
    "ErrorDetail",
    "SchemaError",
    "field_error",
    "validation_details",
]

#: Error type of the errors raised by :func:`field_error`; recognised by :func:`validation_details`.
FIELD_ERROR_TYPE = "kubeserve_invalid"

# Messages for pydantic's error types whose default wording is unhelpful to an API client.
_MESSAGES = {
    "extra_forbidden": "unknown field: not allowed by the schema",
    "missing": "field required",
    "model_type": "expected a JSON object",
    "model_attributes_type": "expected a JSON object",
    "dict_type": "expected a JSON object",
}
_PREFIXES = ("Value error, ", "Assertion failed, ")


class ErrorDetail(TypedDict):
    """One problem of an invalid body: where (JSON path, REST spelling) and what."""

    loc: list[str | int]
    msg: str


class SchemaError(ValueError):
    """A request body that does not match its schema; the API maps it to HTTP 400."""

    def __init__(self, details: list[ErrorDetail]) -> None:
        self.details = details
        summary = "; ".join(f"{_dotted(d['loc'])}: {d['msg']}" for d in details)
        super().__init__(summary or "invalid body")


def field_error(message: str, *at: str | int) -> PydanticCustomError:
    """An error for a rule checked on a whole model but blamed on one of its fields.

    ``at`` is the path from the validated model down to the offending field, e.g.
    ``field_error("duplicate name", "deployments", 2, "name")`` raised from an application's
    validator is reported at ``[..., "deployments", 2, "name"]``. Raise the returned object.
    """
    return PydanticCustomError(FIELD_ERROR_TYPE, "{reason}", {"reason": message, "at": list(at)})


def validation_details(err: ValidationError) -> list[ErrorDetail]:
    """Turn a pydantic error into the API's details: JSON path as sent, clean message."""
    details: list[ErrorDetail] = []
    for e in err.errors(include_url=False):
        loc: list[str | int] = list(e["loc"])
        ctx: Mapping[str, Any] = e.get("ctx") or {}
        if e["type"] == FIELD_ERROR_TYPE:
            loc.extend(ctx.get("at", []))
        details.append({"loc": loc, "msg": _message(e["type"], e["msg"])})
    return details


def _message(kind: str, msg: str) -> str:
    if kind in _MESSAGES:
        return _MESSAGES[kind]
    for prefix in _PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _dotted(loc: list[str | int]) -> str:
    return ".".join(str(part) for part in loc) or "body"
