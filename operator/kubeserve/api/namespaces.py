"""One admin API per namespace: ``/namespaces/<namespace>/...`` addresses that namespace's instance.

Every operation of the admin API (and the dashboard's page) is routed twice, bare and under
:data:`~kubeserve.schema.namespaces.NAMESPACE_PREFIX`; the handlers take their backend from
:func:`request_backend`, so they are the same code for both. The checks of a namespaced request,
in order, so that a caller learns nothing about a namespace it may not use:

1. :func:`namespace_syntax` (first of all): a name that is not a DNS-1123 label is a 400;
2. the server's and the backend's access control (the bearer token, or the operator's TokenReview
   and SubjectAccessReview, which reviews the request in the namespace it addresses): 401, 403;
3. :func:`namespace_backend` (last, before the handler): a namespace the backend does not serve
   is a 404 saying so (:meth:`~kubeserve.backends.protocol.Namespaces.backend`).

``GET /api/kubeserve/namespaces`` lists the namespaces served that the caller may read, for the
dashboard's switcher.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from kubeserve.api.errors import BadRequest, Handler
from kubeserve.backends.protocol import READ_CHECK_KEY, Backend, Namespaces
from kubeserve.schema.namespaces import NAMESPACE_PARAM, namespace_problem, split_namespace

__all__ = [
    "NAMESPACES_KEY",
    "NAMESPACES_PATH",
    "list_namespaces",
    "namespace_backend",
    "namespace_syntax",
    "request_backend",
]

#: The namespaces the caller may read (kubeserve's own path, not Ray's).
NAMESPACES_PATH = "/api/kubeserve/namespaces"
NAMESPACES_KEY = web.AppKey("namespaces", Namespaces)
_BACKEND_KEY = web.RequestKey("backend", Backend)


@web.middleware
async def namespace_syntax(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A 400 for a path naming an invalid namespace, routed or not. Both spellings are checked:
    the route's (decoded after matching: ``a%2Fb`` is ``a/b``) and the path's; once both are valid
    they are the same name, which every later step may read from either."""
    routed = request.match_info.get(NAMESPACE_PARAM)
    for name in (routed, split_namespace(request.path)[0]):
        problem = None if name is None else namespace_problem(name)
        if problem is not None:
            raise BadRequest(problem, [{"loc": ["path", NAMESPACE_PARAM], "msg": problem}])
    return await handler(request)


@web.middleware
async def namespace_backend(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Resolves the backend of the namespace a routed request addresses (404 when none)."""
    namespace = request.match_info.get(NAMESPACE_PARAM)
    if namespace is not None:
        request[_BACKEND_KEY] = request.app[NAMESPACES_KEY].backend(namespace)
    return await handler(request)


def request_backend(request: web.Request, bare: Backend) -> Backend:
    """The backend a request addresses: its namespace's, else ``bare`` (the server's own)."""
    backend = request.get(_BACKEND_KEY)
    return bare if backend is None else backend


async def list_namespaces(request: web.Request) -> web.Response:
    """``{"own": <the bare paths' namespace>, "namespaces": [...]}``: the namespaces served whose
    instance the caller may read (all of them where no access control says otherwise)."""
    namespaces = request.app[NAMESPACES_KEY]
    names = namespaces.names()
    may_read = request.get(READ_CHECK_KEY)
    if may_read is not None:
        allowed = await asyncio.gather(*(may_read(name) for name in names))
        names = [name for name, ok in zip(names, allowed, strict=True) if ok]
    return web.json_response({"own": namespaces.own, "namespaces": names})
