"""The admin server's routes for kubeserve's own processes and pods, shared by both backends.

These routes take no admin token: their callers (proxies, replicas, handle clients) sign each
request with the instance's data-plane secret instead (:mod:`kubeserve.runtime.channel`), and an
unsigned or badly signed request is a 403.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from kubeserve.runtime import channel, wire

__all__ = ["answer_load_report", "refuse_unsigned"]


#: Signatures this process accepted: each signed request is answered once (one admin server per
#: process, so one guard; it holds what two minutes of signing bring, see ReplayGuard).
_REPLAYS = channel.ReplayGuard()


def refuse_unsigned(request: web.Request, secret: bytes | None) -> web.Response | None:
    """A 403 unless ``request`` is signed with ``secret`` (``None``: no secret to check against,
    such as an instance the operator does not know) and its signature was not used before;
    ``None`` when it is."""
    signature = request.headers.get(channel.SIGNATURE_HEADER, "")
    target = request.rel_url.raw_path_qs
    now = time.time()
    if secret and channel.verify_request(secret, signature, "GET", target, now):
        if _REPLAYS.first_use(signature, now):
            return None
        return web.json_response(
            {"error": "for kubeserve's own processes: this signed request was already answered"},
            status=403,
        )
    return web.json_response(
        {"error": "for kubeserve's own processes: unknown instance, or a missing or bad signature"},
        status=403,
    )


def answer_load_report(
    request: web.Request,
    secret: bytes | None,
    record: Callable[[str, dict[str, int]], None],
) -> web.Response:
    """A caller's report of requests waiting for replicas (``GET /-/load``, see
    :mod:`kubeserve.runtime.load_report`): checked against ``secret``, its counts given to
    ``record(source, counts)``; a 400 when they are not counts."""
    refused = refuse_unsigned(request, secret)
    if refused is not None:
        return refused
    try:
        counts = wire.parse_queued(request.query.get("queued", "{}"))
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    record(request.query.get("source", ""), counts)
    return web.json_response({})
