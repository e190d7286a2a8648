"""Where the proxy's CPU per request goes, in-process (no sockets, no syscalls).

    .venv/bin/python benchmarks/proxy_stages.py [--requests 20000] [--rounds 7] [--out FILE.md]

A real proxy's HTTP path (:class:`~kubeserve.runtime.proxy.client.ClientConnection` over a
:class:`~kubeserve.runtime.proxy.state.ProxyState` routing one route to one replica, its access
log written to /dev/null) forwards a request of ``wrk``'s shape to a pooled upstream connection
behind the authenticated channel (:class:`~kubeserve.runtime.sealing.SealedProtocol`), and is fed
the replica's sealed answer, as a replica of ``benchmarks/compare_apps.py`` writes it; transports
only count writes. :data:`CONNECTIONS` client connections get a request each per round, as one
poll of a loaded proxy returns them. CPU time per request is ``time.process_time``'s. Each stage
is measured by taking it away (ablation), variants in turns, ``--rounds`` times, the best round
of each (a busy machine only adds to a round).

What it cannot see is the kernel's share (a ``recv`` and a ``send`` on each side of the hop, the
wake-ups), which ``compare_trees.py`` reads from /proc for the real processes, with nginx's figure
beside it; ``strace -c -f -p PROXY`` under load counts the syscalls per request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(os.environ.get("KUBESERVE_TREE") or Path(__file__).resolve().parents[1])
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(Path(__file__).resolve().parent)]

from stages import CONNECTIONS, REQUEST, WITH_ID, CountingTransport, run_stages  # noqa: E402

#: A kubeserve replica's answer to a no-op (as ``benchmarks/compare_apps.py``'s write it).
ANSWER = (
    b"HTTP/1.1 200 OK\r\nDate: Thu, 26 Nov 2026 12:00:53 GMT\r\n"
    b"x-request-id: f762829eef7eeee9ab48bd280db049d5\r\n"
    b"content-type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nok"
)
SECRET = b"s" * 32


def _proxy(*, access_log: bool = True, metrics: bool = True) -> Callable[[bytes, int], float]:
    """A proxy path: a function serving ``n`` requests (``n / CONNECTIONS`` rounds of one per
    client connection), returning the CPU seconds it took."""
    from kubeserve.runtime import logs
    from kubeserve.runtime.proxy.client import ClientConnection
    from kubeserve.runtime.proxy.state import ProxyState
    from kubeserve.runtime.proxy.upstream import UpstreamConnection
    from kubeserve.runtime.sealing import SealedProtocol, Sealer

    state = ProxyState(secret=SECRET)
    state.apply(
        {
            "version": 1,
            "routes": [{"route_prefix": "/", "app": "bench", "deployment": "AsyncNoop"}],
            "deployments": {
                "bench#AsyncNoop": {
                    "max_ongoing_requests": 100,
                    "replicas": [{"replica_id": "r1", "host": "127.0.0.1", "port": 1}],
                }
            },
        }
    )
    if access_log:
        component = logs.ComponentLog("proxy", "proxy", "bench")
        settings = logs.LogSettings()
        devnull = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
        logs.configure(settings, component, logging.StreamHandler(devnull))
        state.access_log = logs.AccessLog(component, settings.encoding)
    if not metrics:
        state.metrics.record = lambda *args: None  # type: ignore[method-assign]
    route = state.router.try_assign("bench#AsyncNoop", None, "")
    assert route is not None
    pool = state.pool(route)
    state.router.release(route)
    send_key, receive_key = os.urandom(32), os.urandom(32)
    upstream = []  # (sealed channel protocol, the replica's sealer) of each pooled connection
    for _ in range(CONNECTIONS):
        sealed = SealedProtocol(UpstreamConnection(pool), send_key, receive_key)
        sealed.connection_made(CountingTransport())
        pool.put(sealed.inner)  # type: ignore[arg-type]
        upstream.append((sealed, Sealer(receive_key).seal))
    client_transport = CountingTransport()
    clients = []
    for _ in range(CONNECTIONS):
        conn = ClientConnection(state)
        conn.connection_made(client_transport)
        clients.append(conn)

    def serve(request: bytes, n: int) -> float:
        rounds = n // CONNECTIONS
        answers = [(sealed, [seal(ANSWER) for _ in range(rounds)]) for sealed, seal in upstream]
        written = client_transport.writes
        started = time.process_time()
        for i in range(rounds):
            for conn in clients:  # one request on each connection, as one poll returns them
                conn.data_received(request)
            # each pooled connection carries one of them (LIFO: the order does not matter)
            for sealed, sealed_answers in answers:
                sealed.data_received(sealed_answers[i])
        state.metrics.flush()  # what the loop's timers do every 0.5 s, counted in
        if state.access_log is not None:
            state.access_log.flush()
        assert client_transport.writes == written + n - n % CONNECTIONS, "unanswered requests"
        return time.process_time() - started

    return serve


async def measure(requests: int, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per request of each variant."""
    full = _proxy()
    variants: dict[str, tuple[Callable[[bytes, int], float], bytes]] = {
        "everything on": (full, REQUEST),
        "... with the client's request id": (full, WITH_ID),
        "... without the access line": (_proxy(access_log=False), REQUEST),
        "... without metrics": (_proxy(metrics=False), REQUEST),
    }

    for serve, request in variants.values():
        serve(request, 2000)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (serve, request) in variants.items():
            samples[name].append(serve(request, requests) * 1e6 / requests)
            await asyncio.sleep(0)
    return {name: min(values) for name, values in samples.items()}


def table(medians: dict[str, float]) -> str:
    full = medians["everything on"]
    with_id = medians["... with the client's request id"]
    no_access = medians["... without the access line"]
    stages = [
        ("the proxy's whole path (parse, route, replica choice, seal, open, parse the answer, "
         "metrics, access line, request id, response)", full),
        ("request id made up (none from the client)", full - with_id),
        ("access line (batched, formatted off the request)", full - no_access),
        ("metrics (batched per label set)", full - medians["... without metrics"]),
    ]  # fmt: skip
    return "\n".join(
        [
            "| stage | CPU us per request (in-process, best of the rounds) |",
            "|---|---|",
            *(f"| {name} | {value:.1f} |" for name, value in stages),
        ]
    )


def main() -> int:
    return run_stages("proxy_stages.py", measure, table)


if __name__ == "__main__":
    sys.exit(main())
