"""The replica process: serves one deployment of one application on one host:port.

Serving speaks the protocol of :mod:`kubeserve.runtime.wire` behind the handshake of
:mod:`kubeserve.runtime.channel`: the process refuses to start without the instance's data-plane
secret, and removes it from its environment before user code is imported. A proxy's ``INGRESS``
connection carries user traffic only (a path under ``/-/`` is the user's too), a ``CONTROL``
connection internal endpoints only. Coroutines of the user's code run on the event loop, its sync
methods on worker threads (as Ray Serve does by default; ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0``
runs them on the loop, where a blocking method blocks its replica).

Layout (as :mod:`kubeserve.runtime.proxy` is split):

* :mod:`.user_code`: the user's deployment object or function, and how kubeserve calls it;
* :mod:`.state`: :class:`ReplicaState`, what the two sides share: the user's code, the request
  accounting, admission and draining;
* :mod:`.ingress`: user traffic, HTTP, ASGI and WebSocket (:mod:`.asgi` bridges to the ASGI app);
* :mod:`.control`: the internal endpoints, handle calls, health, metrics, reconfigure;
* :mod:`.http`: the HTTP/1.1 server both sides answer through, one handler per channel role;
* :mod:`.probe`: the unauthenticated health listener for the kubelet;
* :mod:`.server`: :func:`serve_replica`, start-up, listening and graceful shutdown;
* :mod:`.command`: ``python -m kubeserve.runtime.replica`` (``kubeserve replica`` in a pod, given
  what the cluster provides by :mod:`kubeserve.runtime.kubernetes.pod`).

Invariants: ``ongoing`` counts user requests and handle calls whose handler has started and not yet
finished (a streamed response counts until its last chunk); the other internal endpoints are not
counted. After SIGTERM no new request is started: the listening socket is closed
and requests arriving on open connections get 503 with ``Connection: close``.
"""

from kubeserve.runtime.replica.command import main
from kubeserve.runtime.replica.control import Control
from kubeserve.runtime.replica.ingress import Ingress
from kubeserve.runtime.replica.server import ReplicaCluster, serve_replica
from kubeserve.runtime.replica.state import ReplicaState
from kubeserve.runtime.replica.user_code import ReplicaStartupError, UserCode

__all__ = [
    "Control",
    "Ingress",
    "ReplicaCluster",
    "ReplicaStartupError",
    "ReplicaState",
    "UserCode",
    "main",
    "serve_replica",
]
