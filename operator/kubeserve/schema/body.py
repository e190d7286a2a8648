"""A request body as JSON values every later step can store, re-encode and echo back.

:func:`json.loads` accepts documents that no later step can handle, and fails on others with
exceptions that carry no location. :func:`decode_json_body` turns every one of them into a
:class:`~kubeserve.schema.errors.SchemaError` naming the JSON path of the offending value:

- bytes that are not UTF-8 (path ``[]``, with the byte offset);
- malformed JSON (path ``[]``, with line and column);
- nesting deeper than :data:`~kubeserve.schema.limits.MAX_JSON_DEPTH` (100,000 nested arrays make
  ``json.loads`` raise ``RecursionError``; 260 levels inside ``user_config`` overflow pydantic's
  serializer later);
- integers outside 64 bits (a 5000-digit integer makes ``json.loads`` raise ``ValueError``),
  ``NaN``/``Infinity`` and numbers that overflow to infinity: neither SQLite's JSON text, the Ray
  client nor Kubernetes read them back;
- strings (values or object keys) holding a lone UTF-16 surrogate such as ``"a\\ud800b"``: they
  decode to Python text that cannot be encoded as UTF-8, so it can be neither stored nor sent.

Pure: no I/O. The happy path is ``json.loads`` (C) plus one iterative walk of the result (a few
hundred milliseconds for the largest accepted body of tiny values); the slower token scan that
locates a problem ``json.loads`` gave up on runs only on that error path.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kubeserve.schema.errors import ErrorDetail, SchemaError, validation_details
from kubeserve.schema.limits import MAX_JSON_DEPTH, MAX_JSON_INT, MIN_JSON_INT

__all__ = ["decode_json_body", "parse_body"]

_M = TypeVar("_M", bound=BaseModel)

Loc = list[str | int]

_TOO_DEEP = f"JSON nested deeper than {MAX_JSON_DEPTH} levels (the limit of a request body)"
_SURROGATE = (
    "text contains a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode and "
    "cannot be stored"
)
_OVERFLOW = "number too large: it overflows to infinity"
# Strings, punctuation, and everything else (numbers and literals) between them.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]|[^\s"\[\]{},:]+')


def decode_json_body(raw: bytes) -> Any:
    """Decode ``raw`` as one JSON document; raise :class:`SchemaError` at the offending path."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error([], f"body is not UTF-8 text: invalid byte at offset {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise _error(
            [], f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except (RecursionError, ValueError):  # too deep, too many digits, NaN or Infinity
        raise SchemaError([_locate(text)]) from None
    problem = _check_tree(value)
    if problem is not None:
        raise SchemaError([problem])
    return value


def parse_body(model: type[_M], data: bytes | str | Any) -> _M:
    """Validate a request body (raw JSON bytes or text, or already decoded) into ``model``.

    Raises :class:`SchemaError` with every problem found; raw input goes through
    :func:`decode_json_body` first, so malformed JSON is a 400 at the empty path ``[]`` (Ray
    answers it with a 500 and a traceback).
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if isinstance(data, bytes):
        data = decode_json_body(data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SchemaError(validation_details(err)) from None


def _error(loc: Loc, msg: str) -> SchemaError:
    return SchemaError([{"loc": loc, "msg": msg}])


# --------------------------------------------------------------------------- scalar rules


def _number_problem(token: str) -> str | None:
    """Why a number (or literal) token cannot be stored, or None when it can."""
    if token in ("NaN", "Infinity", "-Infinity"):
        return f"{token} is not a JSON number"
    if re.fullmatch(r"-?\d+", token):
        digits = token.lstrip("-")
        if len(digits) > 19 or not MIN_JSON_INT <= int(token) <= MAX_JSON_INT:
            shown = token if len(token) <= 24 else f"{token[:20]}... ({len(digits)} digits)"
            return f"integer {shown} does not fit in 64 bits"
        return None
    try:
        if not math.isfinite(float(token)):
            return _OVERFLOW
    except ValueError:
        return None  # true, false, null, or a syntax error json.loads reports itself
    return None


def _parse_constant(token: str) -> float:
    """NaN and Infinity: json.loads accepts them, no other JSON reader does."""
    raise ValueError(token)


def _not_utf8(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _printable(key: str) -> str:
    """An object key safe to put into an error body (lone surrogates escaped)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


# --------------------------------------------------------------------------- decoded tree


def _check_tree(root: Any) -> ErrorDetail | None:
    """Depth and text rules over a decoded document; iterative, so depth costs no stack."""
    if isinstance(root, str):
        return {"loc": [], "msg": _SURROGATE} if _not_utf8(root) else None
    stack: list[tuple[Any, tuple[str | int, ...]]] = []
    if isinstance(root, list | dict):
        stack.append((root, ()))
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            return {"loc": list(path), "msg": _TOO_DEEP}
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and _not_utf8(key):
                return {"loc": [*path, _printable(key)], "msg": _SURROGATE}
            kind = type(child)
            if kind is str:
                if _not_utf8(child):
                    return {"loc": [*path, key], "msg": _SURROGATE}
            elif kind is list or kind is dict:
                stack.append((child, (*path, key)))
            elif kind is int and not MIN_JSON_INT <= child <= MAX_JSON_INT:
                return {"loc": [*path, key], "msg": _number_problem(str(child)) or ""}
            elif kind is float and not math.isfinite(child):
                return {"loc": [*path, key], "msg": _OVERFLOW}
    return None


# --------------------------------------------------------------------------- raw text


def _locate(text: str) -> ErrorDetail:
    """Where ``json.loads`` gave up: the first container nested too deep or the first number
    that cannot be stored, found by scanning tokens (no recursion)."""
    path: list[Any] = []  # one entry per open container: its current key or index
    kinds: list[str] = []
    previous = ""
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ("{", "["):
            if len(kinds) >= MAX_JSON_DEPTH:
                return {"loc": list(path), "msg": _TOO_DEEP}
            kinds.append(token)
            path.append(0 if token == "[" else "")
        elif token in ("}", "]"):
            if kinds:
                kinds.pop()
                path.pop()
        elif token == ",":
            if kinds and kinds[-1] == "[":
                path[-1] += 1
        elif token.startswith('"'):
            if kinds and kinds[-1] == "{" and previous in ("{", ","):
                path[-1] = _printable(json.loads(token))
        elif token != ":":
            problem = _number_problem(token)
            if problem is not None:
                return {"loc": list(path), "msg": problem}
        previous = token
    return {"loc": [], "msg": "the body cannot be decoded as JSON"}
