"""A running replica: start-up, the listening sockets and graceful shutdown.

Start-up, in order: import the application, find this deployment in the graph, construct the
user's code (:mod:`.user_code`) and apply ``user_config``, run the ASGI app's lifespan startup,
then listen, on the TCP port and on the unix socket next to it (:mod:`~kubeserve.runtime.
local_socket`). The port opens only once the user object is ready, so "healthz answers 200" means
"ready". SIGTERM (or SIGINT) starts the graceful shutdown: serve on for ``leave_delay_s`` (while
callers learn that the replica leaves), stop taking work, wait for what is in flight
(:meth:`.state.ReplicaState.drain`), let callers leave, close the lifespan.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeserve.control.user_config import resolve_user_config
from kubeserve.runtime import local_socket, logs, tracing, wire
from kubeserve.runtime.build import format_user_error
from kubeserve.runtime.channel import Role
from kubeserve.runtime.limits import RequestLimits
from kubeserve.runtime.metrics_listener import start_metrics_listener
from kubeserve.runtime.replica.control import Control
from kubeserve.runtime.replica.http import ReplicaHttpServer
from kubeserve.runtime.replica.ingress import Ingress
from kubeserve.runtime.replica.probe import ProbeListener
from kubeserve.runtime.replica.router_class import load_router_class
from kubeserve.runtime.replica.state import ReplicaState
from kubeserve.runtime.replica.user_code import ReplicaStartupError, UserCode, find_node
from kubeserve.sdk import transport

if TYPE_CHECKING:
    from kubeserve.runtime.handle_client import HandleClient

__all__ = ["ReplicaCluster", "configure_logging", "serve_replica"]

log = logging.getLogger("kubeserve.replica")


@dataclass(frozen=True)
class ReplicaCluster:
    """What a replica in a cluster learns from it, given by the command's composition root
    (:mod:`kubeserve.runtime.kubernetes.pod`); a replica on one machine has none."""

    #: the handle client fed by the cluster's routes and replicas (not started), for this
    #: data-plane secret
    handle_client: Callable[[bytes], HandleClient]
    #: ``(True, value)`` when the application's spec overrides this deployment's user_config
    #: (a pod template never carries it), else ``(False, None)``
    user_config_override: Callable[[str], Awaitable[tuple[bool, Any]]]


class LazyHandleTransport:
    """The process's handle transport, made and started by the first handle call.

    A replica whose code never calls another deployment (most ingresses of one deployment) loads
    no router or handle client and holds no watch on the controller's routes: a replica's memory
    and the controller's open connections do not grow with handles nobody uses. The first call
    waits for the client's start (its first view of the replicas), as a call made right after a
    replica's start did before.
    """

    def __init__(self, make: Callable[[], HandleClient]) -> None:
        self._make = make
        self._client: HandleClient | None = None
        self._starting: asyncio.Future[HandleClient] | None = None

    async def _ready(self) -> HandleClient:
        if self._client is not None:
            return self._client
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(self._starting)
        except Exception:
            self._starting = None  # the next call tries again (the controller was away)
            raise

    async def _start(self) -> HandleClient:
        client = self._make()
        try:
            await client.start()
        except BaseException:
            await client.close()
            raise
        self._client = client
        return client

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        client = self._client or await self._ready()
        return await client.call(*args, **kwargs)

    def start_call(self, *args: Any) -> Any:
        """The client's :meth:`~HandleClient.start_call` once it started; None before (the
        first call goes through :meth:`call`, which waits for the start)."""
        client = self._client
        return None if client is None else client.start_call(*args)

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        client = self._client or await self._ready()
        async for item in client.stream(*args, **kwargs):
            yield item

    async def close(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        if self._client is not None:
            await self._client.close()


def _handle_transport(
    controller_url: str | None, secret: bytes, cluster: ReplicaCluster | None
) -> LazyHandleTransport | None:
    """Install the process's handle transport; None (and no transport) without a controller."""
    if cluster is not None:
        client = LazyHandleTransport(lambda: cluster.handle_client(secret))
    elif controller_url:

        def make() -> HandleClient:
            module = importlib.import_module("kubeserve.runtime.handle_client")
            made: HandleClient = module.HandleClient(controller_url, secret=secret)
            return made

        client = LazyHandleTransport(make)
    else:
        return None
    transport.set_transport(client)
    return client


def configure_logging(
    config: wire.ReplicaConfig,
    logging_config: dict[str, Any] | None,
    output: logging.Handler | None = None,
) -> None:
    """Ray's ``logging_config`` on this replica's records: Ray's line format (or JSON), the
    level, the access lines; the replica's and the current request's fields on every record."""
    component = logs.ComponentLog(
        "replica", config["deployment"], config["replica_id"], config["app"], config["deployment"]
    )
    logs.configure(logs.LogSettings(logging_config), component, output)


def _component(config: wire.ReplicaConfig) -> str:
    """The replica as its spans' resource (and default span file) names it."""
    return f"replica_{config['app']}_{config['deployment']}_{config['replica_id']}"


async def _start_user_code(
    config: wire.ReplicaConfig, cluster: ReplicaCluster | None
) -> tuple[UserCode, Any]:
    """The user's object, constructed, and the ``user_config`` it applied."""
    try:
        # before the user's module loads, so its constructor's handle calls trace too; the
        # exporter imports from where the application does (its runtime_env applied)
        tracing.setup(config.get("tracing_config"), _component(config))
        node = find_node(config)
        if config.get("request_router_class"):  # a class that cannot load fails the deploy
            load_router_class(config["request_router_class"])
        user_config = config["user_config"]
        if cluster is not None:  # the pod template never carries user_config
            overridden, value = await cluster.user_config_override(config["deployment"])
            code_default = node.deployment.code_options.get("user_config")
            user_config = resolve_user_config(code_default, overridden, value)
        if "logging_config" not in config and node.deployment.code_options.get("logging_config"):
            # the decorator's, when the config gives none
            configure_logging(config, node.deployment.code_options["logging_config"])
        user = await UserCode.construct(node, config["app"], config["replica_id"])
        await user.reconfigure(user_config)
    except ReplicaStartupError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
            raise
        raise ReplicaStartupError(
            f"replica of {config['app']}#{config['deployment']} failed to start: "
            f"{format_user_error(exc)}"
        ) from exc
    return user, user_config


async def serve_replica(
    config: wire.ReplicaConfig,
    host: str,
    port: int,
    controller_url: str | None,
    secret: bytes,
    *,
    sync_in_threadpool: bool = True,
    cluster: ReplicaCluster | None = None,
    metrics_port: int | None = None,
) -> None:
    """Run the replica until SIGTERM (or SIGINT), then drain and return.

    Without ``sync_in_threadpool`` the user's sync methods run on the event loop instead of
    worker threads (Ray Serve's ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``). ``cluster``: what the
    cluster the replica runs in tells it; ``metrics_port``: where to serve ``GET /metrics``
    (:mod:`~kubeserve.runtime.metrics_listener`), if anywhere.

    Raises :class:`ReplicaStartupError` when the user code cannot be loaded or constructed.
    """
    loop = asyncio.get_running_loop()
    probe = await _start_probe_listener(config, host)
    metrics_listener = await start_metrics_listener(host, metrics_port, secret)
    client = _handle_transport(controller_url, secret, cluster)
    state: ReplicaState | None = None
    try:
        user, applied = await _start_user_code(config, cluster)
        state = ReplicaState(config, user, sync_in_threadpool=sync_in_threadpool)
        state.access_log = logs.active().access_log
        ingress = Ingress(state)
        control = Control(state, applied, ingress.set_route_prefix)
        if ingress.lifespan is not None:
            try:
                await ingress.lifespan.startup()
            except Exception as exc:
                raise ReplicaStartupError(
                    f"replica of {config['app']}#{config['deployment']} failed to start: {exc}"
                ) from exc
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        server = ReplicaHttpServer(
            ingress.handle,
            control=control.handle,
            secret=secret,
            identity=config["replica_id"],
            limits=RequestLimits.from_mapping(config.get("request_limits")),
            websocket=ingress.handle_websocket,
            steps_by_hand={
                Role.INGRESS: ingress.by_hand,
                Role.CONTROL: control.steps_by_hand,
            },
            plain={Role.INGRESS: ingress.start_plain} if ingress.plain else None,
        )
        # An ASCII host as bytes: a ``str`` host is encoded with the "idna" codec, which
        # imports stringprep and unicodedata (~0.4 MB) into every replica for nothing.
        hosts = [host.encode()] if host.isascii() else host
        listener = await loop.create_server(
            server,
            hosts,  # type: ignore[arg-type]
            port,
            reuse_address=True,
            backlog=1024,
        )
        # Bound after the TCP port, so the name derived from the port is this process's.
        local = await local_socket.listen(server, host, port)
        log.info("replica %s listening on %s:%d", config["replica_id"], host, port)
        _watch_health(probe, config, state.user)
        await stop.wait()
        leave_s = float(config.get("leave_delay_s", 0.0))
        if leave_s > 0:  # callers learn that it leaves: it serves what they send meanwhile
            log.info("replica %s leaving in %.1f s", config["replica_id"], leave_s)
            await asyncio.sleep(leave_s)
        log.info("replica %s shutting down", config["replica_id"])
        state.draining = True
        if probe is not None:
            probe.drain()
        listener.close()
        if local is not None:
            local.close()
        await state.drain()
        await _let_callers_leave(server)
        server.close_all()
        if ingress.lifespan is not None:
            await ingress.lifespan.shutdown()
    finally:
        if client is not None:
            transport.set_transport(None)
            await client.close()
        if probe is not None:
            await probe.close()
        if metrics_listener is not None:
            await metrics_listener.close()
        if state is not None:
            state.flush()  # the last requests' metrics and access lines
        batched = logs.batched_access()
        if batched is not None:
            batched.flush()


async def _start_probe_listener(config: wire.ReplicaConfig, host: str) -> ProbeListener | None:
    """The unauthenticated health listener for the kubelet, when the config asks for one."""
    port = config.get("probe_port")
    if port is None:
        return None
    probe = ProbeListener()
    await probe.start(host, port)
    return probe


def _watch_health(probe: ProbeListener | None, config: wire.ReplicaConfig, user: UserCode) -> None:
    """Run the user's ``check_health`` every ``health_check_period_s`` (Ray's defaults: 10 s,
    timeout 30 s) and let the probe listener report the last result."""
    if probe is not None:
        period = float(config.get("health_check_period_s", 10.0))
        timeout = float(config.get("health_check_timeout_s", 30.0))
        probe.watch(user.check_health, period, timeout)


#: After draining, how long a replica waits for its callers to drop their keep-alive connections
#: (they do once discovery tells them the replica left) before it closes them itself.
_CLOSE_GRACE_S = 1.0


async def _let_callers_leave(server: ReplicaHttpServer) -> None:
    """Wait (at most :data:`_CLOSE_GRACE_S`) until no connection is open. A caller that writes a
    request as the replica closes its connection cannot know whether it ran; while the replica
    still reads, such a request is answered "unserved" (503) and safely sent elsewhere."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CLOSE_GRACE_S
    while server.connections and loop.time() < deadline:  # noqa: ASYNC110 - a bounded poll
        await asyncio.sleep(0.02)
