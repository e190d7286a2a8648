"""``python -m kubeserve.runtime.replica`` (and ``kubeserve replica``): the replica process.

``--host H --port P`` with the :class:`~kubeserve.runtime.wire.ReplicaConfig` JSON in
``KUBESERVE_REPLICA_CONFIG`` (or read from the file descriptor ``KUBESERVE_REPLICA_CONFIG_FD``
names), the data-plane secret, and optionally the controller's URL in
``KUBESERVE_CONTROLLER_URL`` so that handles in user code can reach other deployments. Any
start-up failure is printed to stderr and the process exits 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback

import uvloop

from kubeserve.runtime import channel, logs, wire
from kubeserve.runtime.command_line import argument_parser
from kubeserve.runtime.replica.server import ReplicaCluster, configure_logging, serve_replica
from kubeserve.runtime.replica.user_code import ReplicaStartupError, error_text

__all__ = ["SYNC_IN_THREADPOOL_ENV", "main"]

#: Ray Serve's switch for running sync deployment methods on worker threads: on by default, as in
#: Ray; "0" runs them on the event loop (no thread hop per request, but nothing may block).
SYNC_IN_THREADPOOL_ENV = "RAY_SERVE_RUN_SYNC_IN_THREADPOOL"


def main(
    argv: list[str] | None = None,
    *,
    cluster: ReplicaCluster | None = None,
    metrics_port: int | None = None,
) -> int:
    """Entry point of a replica process; returns the exit code (1 when start-up failed).

    ``cluster`` and ``metrics_port`` come from the command's composition root
    (:mod:`kubeserve.runtime.kubernetes.pod`) in a pod; see :func:`serve_replica`.
    """
    parser = argument_parser(prog="python -m kubeserve.runtime.replica")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(argv)
    config_fd = os.environ.pop(wire.REPLICA_CONFIG_FD_ENV, None)
    source = f"file descriptor {config_fd}" if config_fd else wire.REPLICA_CONFIG_ENV
    try:
        if config_fd:
            with os.fdopen(int(config_fd), "rb") as raw:  # closed: user code does not inherit it
                config: wire.ReplicaConfig = json.load(raw)
        else:
            config = json.loads(os.environ[wire.REPLICA_CONFIG_ENV])
    except (KeyError, ValueError, OSError) as exc:
        print(f"replica: no valid config in {source}: {error_text(exc)}", file=sys.stderr)
        return 1
    try:
        configure_logging(config, config.get("logging_config"), logs.output_from_environment())
    except (OSError, ValueError) as exc:
        print(f"replica: cannot set up its log: {error_text(exc)}", file=sys.stderr)
        return 1
    controller_url = os.environ.get(wire.CONTROLLER_URL_ENV) or None
    sync_in_threadpool = os.environ.get(SYNC_IN_THREADPOOL_ENV, "1") != "0"
    try:
        secret = channel.take_secret()
    except ValueError as exc:
        print(f"replica: {exc}", file=sys.stderr)
        return 1
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(
                serve_replica(
                    config,
                    options.host,
                    options.port,
                    controller_url,
                    secret,
                    sync_in_threadpool=sync_in_threadpool,
                    cluster=cluster,
                    metrics_port=metrics_port,
                )
            )
    except ReplicaStartupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        traceback.print_exc()
        print(f"replica: cannot listen on {options.host}:{options.port}: {exc}", file=sys.stderr)
        return 1
    return 0
