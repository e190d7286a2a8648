"""The replica process: serves one deployment of one application on one host:port.

``python -m kubeserve.runtime.replica --host H --port P`` with the :class:`~kubeserve.runtime.wire.
ReplicaConfig` JSON in ``KUBESERVE_REPLICA_CONFIG`` (and, optionally, the controller's URL in
``KUBESERVE_CONTROLLER_URL`` so that handles in user code can reach other deployments).

Start-up, in order: import the application, find this deployment in the graph, replace every bound
node in its constructor arguments by a :class:`~kubeserve.sdk.handle.DeploymentHandle`, construct
the user's class (``async def __init__`` is awaited) or wrap the function, apply ``user_config``
through ``reconfigure``, then listen. The port opens only once the user object is ready, so "healthz
answers 200" means "ready". Any start-up failure is printed to stderr and the process exits 1.

Serving speaks the protocol of :mod:`kubeserve.runtime.wire` behind the handshake of
:mod:`kubeserve.runtime.channel`: the process refuses to start without the instance's data-plane
secret, and removes it from its environment before user code is imported. A proxy's ``INGRESS``
connection carries user traffic only (a path under ``/-/`` is the user's too), a ``CONTROL``
connection internal endpoints only. User methods run on the event loop, sync ones included (as Ray
Serve does by default): a blocking method blocks its replica.

Invariants: ``ongoing`` counts user requests and handle calls whose handler has started and not yet
finished (a streamed response counts until its last chunk); the other internal endpoints are not
counted. After SIGTERM no new request is started: the listening socket is closed
and requests arriving on open connections get 503 with ``Connection: close``.
"""

from kubeserve.runtime.replica.server import (
    Replica,
    ReplicaCluster,
    ReplicaStartupError,
    UserCode,
    is_async_callable,
    main,
    serve_replica,
)

__all__ = [
    "Replica",
    "ReplicaCluster",
    "ReplicaStartupError",
    "UserCode",
    "is_async_callable",
    "main",
    "serve_replica",
]
