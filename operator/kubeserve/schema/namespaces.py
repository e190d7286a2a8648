"""Which serving instance an admin API path addresses: ``/namespaces/<namespace>/<path>``.

The admin server answers every path of the admin API twice: bare (``/api/serve/applications/``),
for the instance of the server's own namespace, and under :data:`NAMESPACE_PREFIX`
(``/namespaces/team-a/api/serve/applications/``), for the instance of that namespace. Ray's
client joins its paths to the address it is given, so ``serve deploy -a
http://admin:8265/namespaces/team-a`` reaches the second form unchanged.

A namespace in a path is a Kubernetes namespace name: a DNS-1123 label. Anything else is refused
before it is used anywhere (in an access review, in an API server URL).
"""

from __future__ import annotations

import re

__all__ = [
    "NAMESPACE_PARAM",
    "NAMESPACE_PREFIX",
    "namespace_problem",
    "split_namespace",
]

#: The route parameter holding the namespace.
NAMESPACE_PARAM = "namespace"
#: What the namespaced form of a path starts with (an aiohttp route pattern).
NAMESPACE_PREFIX = "/namespaces/{" + NAMESPACE_PARAM + "}"

_PREFIX = "/namespaces/"
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_LENGTH = 63


def namespace_problem(name: str) -> str | None:
    """Why ``name`` cannot be a namespace (the 400 a path naming it gets), or None."""
    if len(name) <= _MAX_LENGTH and _DNS_1123_LABEL.fullmatch(name):
        return None
    shown = repr(name[:100])
    return (
        f"invalid namespace {shown} in the path: a namespace name is a DNS-1123 label (at most "
        f"{_MAX_LENGTH} lowercase letters, digits and '-', starting and ending with a letter or "
        "digit)"
    )


def split_namespace(path: str) -> tuple[str | None, str]:
    """``(namespace, path within it)`` of a request path; ``(None, path)`` for a bare path.

    ``/namespaces/team-a/api/ray/version`` -> ``("team-a", "/api/ray/version")``;
    ``/namespaces/team-a`` and ``/namespaces/team-a/`` -> ``("team-a", "/")``.
    """
    if not path.startswith(_PREFIX):
        return None, path
    namespace, slash, rest = path[len(_PREFIX) :].partition("/")
    return namespace, slash + rest if rest else "/"
