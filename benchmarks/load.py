"""HTTP load with wrk: one thread, fixed connections and run length, this machine only.

Each run can also read, from /proc, the CPU time (user + system) that given serving processes
used during it, divided by the requests served: CPU microseconds per request of the process in
front (the first PID: the proxy, nginx's worker, or the replica loaded directly) and of all the
PIDs given (proxy and replicas). Unlike req/s, that figure hardly follows the machine's
background load (it is inflated by heavy contention, not by a busy neighbour core), so it is what
``make bench`` compares with the committed baseline.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

THREADS = 1
CONNECTIONS = 16
DURATION_S = 10
RUNS = 3
WARMUP_S = 2

#: The kubernetes tier's node: its pod bridge and its Service ClusterIPs, on this machine only.
NODE_NETWORKS = (ipaddress.ip_network("10.244.0.0/24"), ipaddress.ip_network("10.96.0.0/16"))

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


@dataclass
class Run:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: CPU microseconds per request of the front process, and of all the serving processes
    cpu_us: float | None = None
    cpu_all_us: float | None = None
    #: the kernel's part (system time) of ``cpu_us``: sockets, the network stack
    cpu_system_us: float | None = None
    #: CPU microseconds per request of each serving process, in the order given
    cpu_each_us: list[float] | None = None
    #: CPU microseconds per request of the whole machine (every process, the load generator's
    #: and the container runtime's too, and the kernel's interrupts): what the run cost
    machine_us: float | None = None


@dataclass
class LoadResult:
    """The runs of one setup; the table reports the run with the median req/s."""

    setup: str
    system: str
    url: str
    connections: int
    runs: list[Run] = field(default_factory=list)
    #: 1-minute load average of the machine at the start and the end of the runs
    load_average: tuple[float, float] = (0.0, 0.0)

    @property
    def median(self) -> Run:
        ordered = sorted(self.runs, key=lambda r: r.requests_per_s)
        return ordered[len(ordered) // 2]

    @property
    def requests_per_s(self) -> float:
        return statistics.median(r.requests_per_s for r in self.runs)

    @property
    def cpu_us(self) -> float | None:
        """Median CPU microseconds per request of the front process (None: not measured)."""
        values = [r.cpu_us for r in self.runs if r.cpu_us is not None]
        return statistics.median(values) if values else None

    @property
    def machine_us(self) -> float | None:
        """Median CPU microseconds per request of the whole machine (None: not measured)."""
        values = [r.machine_us for r in self.runs if r.machine_us is not None]
        return statistics.median(values) if values else None

    @property
    def cpu_system_us(self) -> float | None:
        """Median system-time microseconds per request of the front process."""
        values = [r.cpu_system_us for r in self.runs if r.cpu_system_us is not None]
        return statistics.median(values) if values else None

    @property
    def cpu_all_us(self) -> float | None:
        """Median CPU microseconds per request of all the serving processes."""
        values = [r.cpu_all_us for r in self.runs if r.cpu_all_us is not None]
        return statistics.median(values) if values else None

    @property
    def cpu_each_us(self) -> list[float] | None:
        """Per serving process (in the order given), its median CPU microseconds per request."""
        each = [r.cpu_each_us for r in self.runs if r.cpu_each_us is not None]
        return [statistics.median(values) for values in zip(*each, strict=True)] if each else None


def as_json(result: LoadResult) -> dict[str, Any]:
    """A result with its runs and medians, as the results files hold it."""
    return asdict(result) | {
        "requests_per_s": result.requests_per_s,
        "cpu_us": result.cpu_us,
        "cpu_all_us": result.cpu_all_us,
        "cpu_system_us": result.cpu_system_us,
        "cpu_each_us": result.cpu_each_us,
        "machine_us": result.machine_us,
    }


def machine_busy_s() -> float:
    """CPU seconds the machine has spent busy so far, all CPUs (``/proc/stat``: everything but
    idle and I/O wait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    return sum(cpu_times(pid))


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (nginx's workers of its master)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _latency_ms(text: str, percentile: str) -> float:
    match = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if match is None:
        return float("nan")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(text: str) -> Run:
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    errors = 0
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    if non_2xx:
        errors += int(non_2xx.group(1))
    socket = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    if socket:
        errors += sum(int(g) for g in socket.groups())
    return Run(
        requests_per_s=float(rps.group(1)) if rps else 0.0,
        p50_ms=_latency_ms(text, "50"),
        p99_ms=_latency_ms(text, "99"),
        errors=errors,
    )


def wrk(
    url: str,
    seconds: int,
    connections: int = CONNECTIONS,
    headers: tuple[str, ...] = (),
    pids: Sequence[int] = (),
    command: Sequence[str] = (),
) -> Run:
    """One wrk run against this machine: a loopback address, or a pod or Service of the test
    node (:data:`NODE_NETWORKS`, a bridge inside this machine); ``headers`` as ``"Name:
    value"``, sent on every request; with ``pids`` (the front process first), the run's CPU
    microseconds per request of the front one and of all. ``command`` runs wrk elsewhere (in
    a pod, in a cgroup): the argv that ends with wrk's program, its arguments follow; the
    default is the host's wrk."""
    host = ipaddress.ip_address(urlsplit(url).hostname or "")
    if not (host.is_loopback or any(host in net for net in NODE_NETWORKS)):
        raise ValueError(f"the bench only loads this machine and its test node's pods, not {url}")
    extra = [arg for header in headers for arg in ("-H", header)]
    before = [cpu_times(pid) for pid in pids]
    busy = machine_busy_s()
    out = subprocess.run(
        [*(command or [host_wrk()]), f"-t{THREADS}", f"-c{connections}", f"-d{seconds}s",
         "--timeout", "5s", "--latency", *extra, url],
        capture_output=True, text=True, check=True, timeout=seconds + 30,
    )  # fmt: skip
    busy = machine_busy_s() - busy
    run = parse_wrk(out.stdout)
    served = run.requests_per_s * seconds
    if served:
        run.machine_us = busy * 1e6 / served
    if pids and served:
        after = [cpu_times(pid) for pid in pids]
        used = [sum(now) - sum(start) for now, start in zip(after, before, strict=True)]
        run.cpu_us = used[0] * 1e6 / served
        run.cpu_all_us = sum(used) * 1e6 / served
        run.cpu_system_us = (after[0][1] - before[0][1]) * 1e6 / served
        run.cpu_each_us = [one * 1e6 / served for one in used]
    return run


def host_wrk() -> str:
    """The path of this machine's wrk."""
    wrk_bin = shutil.which("wrk")
    if wrk_bin is None:
        raise RuntimeError("wrk is not installed (make bench installs it with apt-get)")
    return wrk_bin


def _cpu_text(result: LoadResult) -> str:
    front, total, system = result.cpu_us, result.cpu_all_us, result.cpu_system_us
    if front is None or total is None or system is None:
        return ""
    return f"  CPU {front:6.1f} us/req front ({system:.1f} system), {total:6.1f} all"


def measure(
    setup: str, system: str, url: str, runs: int = RUNS, pids: Sequence[int] = ()
) -> LoadResult:
    """A short warm-up, then ``runs`` runs of ``DURATION_S`` seconds (``pids``: see :func:`wrk`)."""
    result = LoadResult(setup, system, url, CONNECTIONS)
    wrk(url, WARMUP_S)
    before = os.getloadavg()[0]
    for _ in range(runs):
        result.runs.append(wrk(url, DURATION_S, pids=pids))
    result.load_average = (before, os.getloadavg()[0])
    m = result.median
    print(
        f"  {system:>15} | {setup:<28} {m.requests_per_s:9.0f} req/s  p50 {m.p50_ms:7.2f} ms"
        f"  p99 {m.p99_ms:7.2f} ms  errors {sum(r.errors for r in result.runs)}"
        f"{_cpu_text(result)}",
        flush=True,
    )
    return result


def measure_together(
    setups: Sequence[tuple[str, str, str] | tuple[str, str, str, Sequence[int]]],
    runs: int = RUNS,
    commands: Sequence[Sequence[str]] = (),
    seconds: int = DURATION_S,
    warmup_s: int = WARMUP_S,
) -> list[LoadResult]:
    """Setups ``(setup, system, url[, pids])`` measured in turns, after a warm-up of
    ``warmup_s`` each: run 1 of each, then run 2 of each..., of ``seconds`` each; ``commands``,
    when given, run each setup's wrk (see :func:`wrk`).

    For figures compared as ratios (proxy vs direct): on a shared machine the background changes
    over minutes, and taking the runs in turns exposes every setup to the same background.
    """
    results = [LoadResult(s[0], s[1], s[2], CONNECTIONS) for s in setups]
    pids = [tuple(s[3]) if len(s) > 3 else () for s in setups]  # type: ignore[misc]
    launchers = list(commands) or [()] * len(setups)
    for result, command in zip(results, launchers, strict=True):
        wrk(result.url, warmup_s, command=command)
    before = os.getloadavg()[0]
    for _ in range(runs):
        for result, its_pids, command in zip(results, pids, launchers, strict=True):
            result.runs.append(wrk(result.url, seconds, pids=its_pids, command=command))
    after = os.getloadavg()[0]
    for result in results:
        result.load_average = (before, after)
        m = result.median
        print(
            f"  {result.system:>15} | {result.setup:<28} {m.requests_per_s:9.0f} req/s  "
            f"p50 {m.p50_ms:7.2f} ms  p99 {m.p99_ms:7.2f} ms  "
            f"errors {sum(r.errors for r in result.runs)}{_cpu_text(result)}",
            flush=True,
        )
    return results
