"""Where a real replica's CPU per request goes, stage by stage, in-process (no sockets or syscalls).

    .venv/bin/python benchmarks/replica_stages.py [--requests 20000] [--rounds 7] [--out FILE.md]

The replica is built as ``kubeserve start`` builds it (:mod:`kubeserve.runtime.replica.server`):
:class:`~kubeserve.runtime.replica.http.ReplicaHttpServer` with the replica's ``Ingress`` and
``Control`` handlers and their ``steps_by_hand`` rules, its :class:`ReplicaState`, logging into
/dev/null as a replica configures it, and every connection behind the authenticated channel
(:class:`~kubeserve.runtime.sealing.SealedProtocol`, the protocol a connection has once its
handshake passed): the requests it is fed are sealed frames of ``wrk``'s shape, as the proxy
forwards them, and its answers are sealed on their way out to transports that only count writes.
:data:`~stages.CONNECTIONS` connections get a request each per round, as one poll of a loaded
replica returns them. CPU time per request is ``time.process_time``'s (a sync handler's worker
thread included: it is the same process). Each stage is measured by taking it away (ablation),
the variants in turns, ``--rounds`` times, the best round of each (a busy machine only adds).

Paths measured: the async no-op (``compare_apps.py``'s ``AsyncNoop``), the sync no-op (``Noop``,
a worker thread per call) and the chain's leaf (``Leaf.answer``, a handle call on a ``CONTROL``
connection, pickled arguments and answer, as the chain's ingress sends it). The chain's ingress
is the async no-op's path plus a handle call, whose caller side ``proxy_stages.py`` does not
cover; ``compare_trees.py`` measures the real processes.

What it cannot see is the kernel's share (the reads, writes and wake-ups), which
``compare_trees.py`` reads from /proc for the real processes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("KUBESERVE_TREE") or Path(__file__).resolve().parents[1])
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(Path(__file__).resolve().parent)]

from stages import (  # noqa: E402
    CONNECTIONS,
    REQUEST,
    WITH_ID,
    CountingTransport,
    replica_state,
    run_stages,
)


def _call_request() -> bytes:
    from kubeserve.runtime import wire

    body = wire.encode_call((), {}, {"request_id": "0123456789abcdef0123456789abcdef"})
    return b"POST /-/call/answer HTTP/1.1\r\nHost: replica\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def _replica(
    deployment: str,
    *,
    access_log: bool = True,
    metrics: bool = True,
    context: bool = True,
    sealed: bool = True,
    tasks: bool = True,
) -> Callable[[bytes, int], Any]:
    """A replica serving ``compare_apps.py``'s ``deployment``: a coroutine function serving ``n``
    requests (``n / CONNECTIONS`` rounds of one per connection), returning the CPU seconds."""
    from kubeserve.runtime.channel import Role
    from kubeserve.runtime.replica import control as control_module
    from kubeserve.runtime.replica import ingress as ingress_module
    from kubeserve.runtime.replica.control import Control
    from kubeserve.runtime.replica.http import ReplicaHttpServer
    from kubeserve.runtime.replica.ingress import Ingress
    from kubeserve.runtime.sealing import SealedProtocol, Sealer

    state = await replica_state(deployment, access_log=access_log, metrics=metrics)
    ingress, control = Ingress(state), Control(state, None)
    if not context:  # module-level functions, patched for this variant's process only
        ingress_module._enter_request = lambda request, route: ""  # type: ignore[assignment]
        control_module._enter_call = lambda options: ""  # type: ignore[assignment]
    role = Role.CONTROL if deployment == "Leaf" else Role.INGRESS

    def by_hand(rule: Callable[[Any], bool] | bool) -> Callable[[Any], bool] | bool:
        return rule if tasks else True

    server = ReplicaHttpServer(
        ingress.handle,
        control=control.handle,
        steps_by_hand={
            Role.INGRESS: by_hand(ingress.by_hand),
            Role.CONTROL: by_hand(control.steps_by_hand),
        },
    )
    transport = CountingTransport()
    feeds = []  # per connection: (data_received, seal of what the proxy sends it)
    for _ in range(CONNECTIONS):
        conn: Any = server._connection(role)
        if sealed:
            key_in, key_out = os.urandom(32), os.urandom(32)
            protocol = SealedProtocol(conn, key_out, key_in)
            own = CountingTransport(transport)  # its protocol: whichever takes the frames
            own.set_protocol(protocol)
            protocol.connection_made(own)
            receiving: Any = own.protocol
            feeds.append((receiving.data_received, Sealer(key_in).seal))
        else:
            conn.connection_made(transport)
            feeds.append((conn.data_received, lambda data: data))
    loop = asyncio.get_running_loop()

    async def serve(request: bytes, n: int) -> float:
        rounds = n // CONNECTIONS
        frames = [(feed, [seal(request) for _ in range(rounds)]) for feed, seal in feeds]
        started = time.process_time()
        for i in range(rounds):
            expected = transport.writes + CONNECTIONS
            for feed, sealed_requests in frames:  # as one poll returns one on each connection
                feed(sealed_requests[i])
            while transport.writes < expected:  # some handlers suspended: wait for them
                transport.waiter = loop.create_future()
                await transport.waiter
        state.metrics_recorder.flush()  # what the loop's timer does every 0.1 s, counted in
        return time.process_time() - started

    return serve


async def measure(requests: int, rounds: int) -> dict[str, float]:
    """Best CPU microseconds per request of each variant."""
    call = _call_request()
    full = await _replica("AsyncNoop")
    variants: dict[str, tuple[Callable[[bytes, int], Any], bytes]] = {
        "async no-op, everything on": (full, REQUEST),
        "... with the client's request id": (full, WITH_ID),
        "... without the access line": (await _replica("AsyncNoop", access_log=False), REQUEST),
        "... without metrics": (await _replica("AsyncNoop", metrics=False), REQUEST),
        "... without the channel's MAC": (await _replica("AsyncNoop", sealed=False), REQUEST),
        "... without a task per request": (await _replica("AsyncNoop", tasks=False), REQUEST),
        "sync no-op, everything on": (await _replica("Noop"), REQUEST),
        "chain's leaf: handle call, everything on": (await _replica("Leaf"), call),
        "... without the access line ": (await _replica("Leaf", access_log=False), call),
        "... without metrics ": (await _replica("Leaf", metrics=False), call),
        "... without a task per call": (await _replica("Leaf", tasks=False), call),
    }
    # The request context is patched module-wide: its variants are made (and run) last.
    variants["async no-op without the request context"] = (
        await _replica("AsyncNoop", context=False),
        REQUEST,
    )
    for serve, request in variants.values():
        await serve(request, 2000)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (serve, request) in variants.items():
            samples[name].append(await serve(request, requests) * 1e6 / requests)
            await asyncio.sleep(0)
    return {name: min(values) for name, values in samples.items()}


def table(best: dict[str, float]) -> str:
    full = best["async no-op, everything on"]
    leaf = best["chain's leaf: handle call, everything on"]
    stages = [
        ("async no-op: the whole path (open the frame, parse, request id, request context, "
         "metrics, the handler in its task, access line, response, seal)", full),
        ("... request id made up (none from the client)",
         full - best["... with the client's request id"]),
        ("... access line (batched, formatted off the request)",
         full - best["... without the access line"]),
        ("... metrics (batched per label set)", full - best["... without metrics"]),
        ("... channel MAC (open the request's frame, seal the answer's)",
         full - best["... without the channel's MAC"]),
        ("... the task an async handler runs in", full - best["... without a task per request"]),
        ("... request context (contextvars)",
         full - best["async no-op without the request context"]),
        ("sync no-op: the whole path (a worker thread per call)",
         best["sync no-op, everything on"]),
        ("... the thread hop (sync minus async)", best["sync no-op, everything on"] - full),
        ("chain's leaf: a handle call's whole path (pickled call and answer)", leaf),
        ("... access line", leaf - best["... without the access line "]),
        ("... metrics", leaf - best["... without metrics "]),
        ("... the task an async method runs in", leaf - best["... without a task per call"]),
    ]  # fmt: skip
    return "\n".join(
        [
            "| stage | CPU us per request (in-process, best of the rounds) |",
            "|---|---|",
            *(f"| {name} | {value:.1f} |" for name, value in stages),
        ]
    )


def main() -> int:
    return run_stages("replica_stages.py", measure, table)


if __name__ == "__main__":
    sys.exit(main())
