"""The operator process's main: the :class:`~.operator.Operator`, its admin server, its metrics
listener and kopf, in one event loop until SIGINT or SIGTERM.

With leader election (:attr:`~.operator.OperatorSettings.election`), the admin server and the
caches run from start to stop on every replica (the Deployment's readiness is "serving the
API"), while kopf and the reconcile worker run only during a term of leadership: started when the
Lease is taken, stopped when it is lost (the writes were fenced at that moment already), started
again at the next term. A clean stop ends kopf, then releases the Lease.

Ownership: this function owns every listener it opens and closes them all, and the operator,
whichever way kopf ends. It reads no flags and no environment: everything arrives in the
:class:`~.operator.OperatorSettings` the CLI built once. The admin server's routes live in a higher
layer (:mod:`kubeserve.api`), so the caller hands over the function that builds it
(:data:`AdminApp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence

import kopf
from aiohttp import web
from aiohttp.typedefs import Middleware

from kubeserve.backends.kubernetes.admin_auth import KubernetesAuthorizer
from kubeserve.backends.kubernetes.backend import KubernetesBackend
from kubeserve.backends.kubernetes.handlers import register
from kubeserve.backends.kubernetes.leader import LeaderElector
from kubeserve.backends.kubernetes.namespaces import WatchedNamespaces
from kubeserve.backends.kubernetes.operator import Operator, OperatorSettings

__all__ = ["AdminApp", "run_operator"]

log = logging.getLogger(__name__)

#: builds the admin server over the backend of the operator's namespace and those of every watched
#: namespace, with the access control the backend brings
#: (:func:`kubeserve.api.server.create_app` with ``namespaces=`` and ``middlewares=``)
AdminApp = Callable[[KubernetesBackend, WatchedNamespaces, Sequence[Middleware]], web.Application]


async def run_operator(settings: OperatorSettings, admin_app: AdminApp) -> int:
    """Run the operator until SIGINT or SIGTERM; the exit code."""
    stop = asyncio.Event()
    _stop_on_signals(stop)
    elector = _elector(settings)
    operator = Operator(settings, elector)
    await operator.start()
    try:
        async with _admin_server(operator, admin_app), _metrics_server(operator):
            if elector is None:
                await _reconcile(operator, stop)
            else:
                await _reconcile_when_leading(operator, elector, stop)
    finally:
        await operator.close()
    return 0


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def _elector(settings: OperatorSettings) -> LeaderElector | None:
    election = settings.election
    if election is None:
        return None
    return LeaderElector(
        settings.kubeconfig,
        settings.namespace,
        election.lease_name,
        election.identity,
        election.advertise_url,
        election.timing,
    )


async def _reconcile(operator: Operator, stop: asyncio.Event, *until: asyncio.Event) -> None:
    """Reconcile (the worker and kopf) until ``stop`` or one of ``until`` is set."""
    operator.lead()
    try:
        await _run_kopf(operator, stop, *until)
    finally:
        await operator.follow()


async def _reconcile_when_leading(
    operator: Operator, elector: LeaderElector, stop: asyncio.Event
) -> None:
    await elector.start()
    try:
        while not stop.is_set():
            await _first(stop, elector.leading)
            if not stop.is_set():
                await _reconcile(operator, stop, elector.lost)
    finally:
        await elector.stop()


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


@contextlib.asynccontextmanager
async def _admin_server(operator: Operator, admin_app: AdminApp) -> AsyncIterator[None]:
    settings = operator.settings
    assert operator.cluster is not None and operator.kube is not None  # started
    if settings.watch_namespaces and settings.namespace not in settings.watch_namespaces:
        log.warning(
            "the admin API writes to namespace %s, which the operator does not watch: "
            "GET /api/serve/applications/ will not see what it deploys",
            settings.namespace,
        )
    # the admin API's writes are custom resources, fine from any replica: not fenced
    kube, cache = operator.kube, operator.cluster.cache
    namespaces = WatchedNamespaces(
        kube, cache, settings.namespace, settings.watch_namespaces, reports=operator
    )
    authorizer = KubernetesAuthorizer(kube, settings.namespace)
    app = admin_app(namespaces.backend(settings.namespace), namespaces, [authorizer.middleware])
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    async with _listening(runner, settings.admin_hosts, settings.admin_port):
        yield


@contextlib.asynccontextmanager
async def _metrics_server(operator: Operator) -> AsyncIterator[None]:
    """``GET /metrics`` on :attr:`~.operator.OperatorSettings.metrics_port` (none when 0)."""
    settings = operator.settings
    if not settings.metrics_port:
        yield
        return

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=operator.metrics(), content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    async with _listening(
        web.AppRunner(app, access_log=None), settings.admin_hosts, settings.metrics_port
    ):
        yield


@contextlib.asynccontextmanager
async def _listening(runner: web.AppRunner, hosts: Sequence[str], port: int) -> AsyncIterator[None]:
    await runner.setup()
    try:
        for host in hosts:
            await web.TCPSite(runner, host, port).start()
        yield
    finally:
        await runner.cleanup()


async def _run_kopf(operator: Operator, stop: asyncio.Event, *until: asyncio.Event) -> None:
    """kopf's own loop with the operator's handlers, until ``stop`` or one of ``until`` is set.

    kopf takes SIGINT and SIGTERM over while it runs (and ends on them): when it ends without
    having been asked to, it ended for a signal (or a failure of its own), which stops the
    process; the process's own handlers come back either way, for the time it runs without kopf.
    (Whether it was asked is remembered when asking, not read off the events afterwards: a term
    lost and won back while kopf was stopping has ``lost`` clear again, and is no reason to
    exit; nor off kopf's stop flag, which kopf itself sets on a signal.)

    When asked, the operator's own passes stop first (:meth:`~.operator.Operator.follow`), then
    kopf: kopf ends by waiting for, cancelling and then re-raising the failure of *every* task
    of the loop created while it ran, its own or not, and a pass's write refused by the fence
    (the term ended) is such a failure. What kopf re-raises once asked to stop is therefore the
    expected end of a term's writes: logged, never the end of the process."""
    registry = kopf.OperatorRegistry()
    register(registry, operator)
    namespaces = list(operator.settings.watch_namespaces)
    stop_flag: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    asked: list[bool] = []

    async def _stop_when_asked() -> None:
        try:
            await _first(stop, *until)
            # (kopf, stopping on a signal, cancels the waits _first made: that is no asking)
            if stop.is_set() or any(event.is_set() for event in until):
                asked.append(True)
                await operator.follow()  # the passes end in the operator's hands, not kopf's
        finally:
            if not stop_flag.done():
                stop_flag.set_result(None)

    stop_task = asyncio.ensure_future(_stop_when_asked())
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            stop_flag=stop_flag,
        )
    except Exception as exc:
        if not asked:
            raise
        log.info("reconciling stopped; a pass in flight ended with: %r", exc)
    finally:
        if not asked:  # kopf ended without being asked: a signal, or its own failure
            stop_task.cancel()
            stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await stop_task
        _stop_on_signals(stop)
