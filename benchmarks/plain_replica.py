"""A replica server without the data-plane handshake: the bench's "direct to replica" row.

Replicas take authenticated connections only (``kubeserve.runtime.channel``), so wrk (and nginx,
the reference proxy) cannot talk to a real replica's port. This process serves the same
application with the same code, the replica's :class:`~kubeserve.runtime.replica.ingress.Ingress`
behind :class:`~kubeserve.runtime.replica.http.ReplicaHttpServer`, with ``secret=None``: every
connection is user traffic from its first byte. The handshake costs one round trip per new
connection and nothing per request (connections are kept alive), so requests cost here exactly what
they cost on a real replica; the proxy row still goes through the real replica and its handshake.

    python benchmarks/plain_replica.py benchmarks.apps:noop Noop PORT    # prints "ready" when up
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


async def serve(import_path: str, deployment: str, port: int) -> None:
    from kubeserve.runtime import wire
    from kubeserve.runtime.build import load_application
    from kubeserve.runtime.replica.http import ReplicaHttpServer
    from kubeserve.runtime.replica.ingress import Ingress
    from kubeserve.runtime.replica.server import configure_logging
    from kubeserve.runtime.replica.state import ReplicaState
    from kubeserve.runtime.replica.user_code import UserCode

    node = next(n for n in load_application(import_path).deployments() if n.name == deployment)
    config: wire.ReplicaConfig = {
        "app": "bench",
        "deployment": deployment,
        "import_path": import_path,
        "replica_id": "plain",
        "user_config": None,
        "max_ongoing_requests": 100,
        "graceful_shutdown_wait_loop_s": 0.1,
        "graceful_shutdown_timeout_s": 1.0,
    }
    # Logs as a replica of `kubeserve start` writes them (access lines batched), into /dev/null.
    configure_logging(config, None, logging.StreamHandler(open(os.devnull, "w")))  # noqa: ASYNC230, SIM115
    ingress = Ingress(ReplicaState(config, await UserCode.construct(node, "bench")))
    server = ReplicaHttpServer(ingress.handle)  # no secret: no handshake
    await asyncio.get_running_loop().create_server(server, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    await asyncio.Event().wait()


class PlainReplica(NamedTuple):
    url: str
    pid: int


@contextlib.contextmanager
def running(import_path: str, deployment: str, port: int) -> Iterator[PlainReplica]:
    """A plain replica of ``deployment`` on ``127.0.0.1:port`` (its URL and PID), for the
    block."""
    proc = subprocess.Popen(
        [sys.executable, __file__, import_path, deployment, str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the plain replica did not start (exit {proc.poll()})")
        yield PlainReplica(f"http://127.0.0.1:{port}/", proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    import uvloop

    sys.path[:0] = [str(ROOT), str(ROOT / "operator")]
    uvloop.run(serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
