"""Where a replica's CPU per request goes, stage by stage, in-process (no sockets, no syscalls).

    .venv/bin/python benchmarks/stages.py [--requests 20000] [--rounds 5] [--out FILE.md]

A real replica's HTTP path (:class:`~kubeserve.runtime.replica.http.ReplicaHttpServer` with the
replica's :class:`~kubeserve.runtime.replica.ingress.Ingress` and :class:`ReplicaState`, logging
configured as a replica of ``kubeserve start`` configures it, into /dev/null) is fed a request of
``wrk``'s shape through a transport that only counts writes, and the CPU time per request is read
with ``time.process_time``; :data:`CONNECTIONS` connections get a request each per round, as
one poll of a loaded replica returns them. Each stage's cost is measured by taking it away: the
same path with one feature switched off, the difference being that feature's cost (ablation).
Variants run in turns, ``--rounds`` times, and the table gives medians, so a busy neighbour core
moves every row alike.

Measured this way:

* the whole path for an ``async def`` no-op (``compare_apps.py``'s ``AsyncNoop``);
* the access line (``enable_access_log`` off), the metrics (the recorder's calls made no-ops),
  the request id (the client sends one, so none is made up), the Starlette request a handler with
  a ``request`` parameter receives (a handler without one);
* a plain ``def`` no-op (Ray's default: a worker thread per call, :mod:`~kubeserve.runtime.
  thread_hop`), minus the async one: the hop;
* the authenticated channel's framing (:mod:`~kubeserve.runtime.sealing`): sealing and opening
  the request and the response, as the proxy and the replica each do once per request.

What it cannot see: the kernel's share (a ``recv`` and a ``send`` per request on each side of a
hop, and the wake-ups of the processes), which ``compare_trees.py`` and ``make bench`` measure as
CPU per request of the real processes. Together they are the accounting the issue asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

#: Connections served at once (wrk's -c16 in the bench): each round feeds a request to each.
CONNECTIONS = 16
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: wrk\r\n\r\n"
WITH_ID = REQUEST[:-2] + b"X-Request-Id: 0123456789abcdef0123456789abcdef\r\n\r\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nDate: Wed, 25 Nov 2026 22:00:00 GMT\r\n"
    b"x-request-id: 0123456789abcdef0123456789abcdef\r\n"
    b"content-type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nok"
)


class CountingTransport(asyncio.Transport):
    """Takes writes and counts them (into ``counter``'s count when given: one count for several
    connections); wakes whoever waits for the next one."""

    def __init__(self, counter: CountingTransport | None = None) -> None:
        super().__init__()
        self.writes = 0
        self.waiter: asyncio.Future[None] | None = None
        self.counter = counter or self
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: Any) -> None:
        self._wrote()

    def writelines(self, list_of_data: Any) -> None:
        self._wrote()

    def _wrote(self) -> None:
        counter = self.counter
        counter.writes += 1
        if counter.waiter is not None and not counter.waiter.done():
            counter.waiter.set_result(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol  # type: ignore[return-value]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def replica_state(deployment: str, *, access_log: bool = True, metrics: bool = True) -> Any:
    """The :class:`~kubeserve.runtime.replica.state.ReplicaState` of ``compare_apps.py``'s
    ``deployment`` as a replica builds it, logging into /dev/null; without ``metrics``, its
    recorder records nothing."""
    from kubeserve.runtime import wire
    from kubeserve.runtime.build import load_application
    from kubeserve.runtime.replica.server import configure_logging
    from kubeserve.runtime.replica.state import ReplicaState
    from kubeserve.runtime.replica.user_code import UserCode

    import_path = f"benchmarks.compare_apps:{_APPS[deployment]}"
    node = next(n for n in load_application(import_path).deployments() if n.name == deployment)
    config: wire.ReplicaConfig = {
        "app": "bench",
        "deployment": deployment,
        "import_path": import_path,
        "replica_id": "stages",
        "user_config": None,
        "max_ongoing_requests": 100,
        "graceful_shutdown_wait_loop_s": 0.1,
        "graceful_shutdown_timeout_s": 1.0,
    }
    devnull = open(os.devnull, "w")  # noqa: ASYNC230, SIM115 - for the process's life
    configure_logging(config, {"enable_access_log": access_log}, logging.StreamHandler(devnull))
    state = ReplicaState(config, await UserCode.construct(node, "bench"))
    state.access_log = access_log
    if not metrics:
        recorder = state.metrics_recorder
        recorder.changed = recorder.flush = lambda: None  # type: ignore[method-assign]
        recorder.done = lambda route, latency_ms: None  # type: ignore[method-assign]
    return state


async def _replica(
    deployment: str, *, access_log: bool = True, metrics: bool = True
) -> Callable[[bytes, int], Any]:
    """A replica path of ``compare_apps.py``'s ``deployment``: a coroutine function serving
    ``n`` copies of a request, one after the other, returning the CPU seconds it took."""
    from kubeserve.runtime.replica.http import ReplicaHttpServer
    from kubeserve.runtime.replica.ingress import Ingress

    state = await replica_state(deployment, access_log=access_log, metrics=metrics)
    server = ReplicaHttpServer(Ingress(state).handle)
    transport = CountingTransport()
    connections = []
    for _ in range(CONNECTIONS):
        conn: Any = server()
        conn.connection_made(transport)
        connections.append(conn)
    loop = asyncio.get_running_loop()

    async def serve(request: bytes, n: int) -> float:
        started = time.process_time()
        for _ in range(n // CONNECTIONS):
            expected = transport.writes + CONNECTIONS
            for conn in connections:  # as one poll returns a request on each connection
                conn.data_received(request)
            while transport.writes < expected:  # some handlers suspended: wait for them
                transport.waiter = loop.create_future()
                await transport.waiter
        return time.process_time() - started

    return serve


_APPS = {"AsyncNoop": "async_noop", "Noop": "noop", "Leaf": "chain"}


def _sealing(n: int) -> float:
    """CPU seconds to seal and open ``n`` requests and ``n`` responses (one frame each)."""
    from kubeserve.runtime.sealing import Opener, Sealer

    key = os.urandom(32)
    seal_request, open_request = Sealer(key).seal, Opener(key).feed
    seal_response, open_response = Sealer(key[::-1]).seal, Opener(key[::-1]).feed
    started = time.process_time()
    for _ in range(n):
        open_request(seal_request(WITH_ID))
        open_response(seal_response(RESPONSE))
    return time.process_time() - started


async def measure(requests: int, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per request of each variant."""
    variants: dict[str, tuple[Callable[[bytes, int], Any], bytes]] = {}
    full = await _replica("AsyncNoop")
    variants["async no-op, everything on"] = (full, REQUEST)
    variants["... with the client's request id"] = (full, WITH_ID)
    quiet = await _replica("AsyncNoop", access_log=False)
    variants["... without the access line"] = (quiet, REQUEST)
    variants["... without metrics"] = (await _replica("AsyncNoop", metrics=False), REQUEST)
    variants["sync no-op (a worker thread per call)"] = (await _replica("Noop"), REQUEST)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    samples["sealing: a request and a response, both ends"] = []
    for serve, request in variants.values():
        await serve(request, 2000)  # warm-up
    for _ in range(rounds):
        for name, (serve, request) in variants.items():
            samples[name].append(await serve(request, requests) * 1e6 / requests)
        samples["sealing: a request and a response, both ends"].append(
            _sealing(requests) * 1e6 / requests
        )
    return {name: statistics.median(values) for name, values in samples.items()}


def table(medians: dict[str, float]) -> str:
    full = medians["async no-op, everything on"]
    with_id = medians["... with the client's request id"]
    no_access = medians["... without the access line"]
    no_metrics = medians["... without metrics"]
    stages = [
        ("the whole replica path, async no-op (HTTP parse, routing to the handler, request "
         "context, Starlette request, metrics, access line, request id, response)", full),
        ("request id made up (none from the client)", full - with_id),
        ("access line (batched, formatted off the request)", full - no_access),
        ("metrics (batched per label set, flushed every 0.5 s)", full - no_metrics),
        ("thread hop of a sync handler (its whole path minus the async one)",
         medians["sync no-op (a worker thread per call)"] - full),
        ("sealing: MAC of the request and the response, at both ends of the channel",
         medians["sealing: a request and a response, both ends"]),
    ]  # fmt: skip
    lines = [
        "| stage | CPU us per request (in-process, median) |",
        "|---|---|",
        *(f"| {name} | {value:.1f} |" for name, value in stages),
        "",
        "| variant | CPU us per request (in-process, median) |",
        "|---|---|",
        *(f"| {name} | {value:.1f} |" for name, value in medians.items()),
    ]
    return "\n".join(lines)


def run_stages(
    script: str,
    measure: Callable[[int, int], Awaitable[dict[str, float]]],
    table: Callable[[dict[str, float]], str],
) -> int:
    """The command line of a stages benchmark: ``--requests``, ``--rounds``, ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import uvloop

    medians = uvloop.run(measure(args.requests, args.rounds))
    text = (
        f"Measured by `benchmarks/{script}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f}, {args.rounds} rounds of {args.requests} requests.\n\n"
        + table(medians)
        + "\n"
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


def main() -> int:
    return run_stages("stages.py", measure, table)


if __name__ == "__main__":
    sys.exit(main())
