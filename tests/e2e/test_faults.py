"""Faults under load: kill -9 a replica, the proxy and the controller while clients send requests.

A real ``kubeserve start`` serves an application of three replicas that records each execution by
request id; 12 clients send requests with unique ``x-request-id`` values on keep-alive connections.
At random instants (seeded, printed) the test kills with SIGKILL: one replica, then the proxy, then
``kubeserve start`` itself (its replicas and proxy die with it), which it starts again on the same
state directory.

What must hold: no request runs twice (asserted: a request whose replica died may fail, it is never
re-sent), every request answered 200 ran exactly once, serving resumes after each kill, and once it
has resumed no request is lost until the next kill. What is measured and printed (``pytest -s``):
requests lost per phase (most while nothing serves, plus those in flight on a killed replica) and
how long until serving again.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

from support.common import pid_alive, wait_for
from support.kubeserve_start import Kubeserve
from support.load import Load, Outcome


def executions(directory: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in directory.glob("executions-*"):
        for line in path.read_text().splitlines():
            counts[line.split(" ", 1)[0]] += 1
    return counts


def test_no_request_runs_twice_when_replicas_proxy_and_controller_are_killed(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    record = tmp_path / "record"
    record.mkdir()
    ks = Kubeserve(tmp_path / "state")
    ks.start()
    figures: list[str] = [f"seed {seed}"]
    try:
        app = {
            "name": "faults",
            "route_prefix": "/",
            "import_path": "fault_recorder:app",
            "runtime_env": {"env_vars": {"KS_FAULT_DIR": str(record)}},
        }
        assert ks.put([app])[0] == 200
        ks.wait_app("faults", timeout_s=90)
        ks.wait_proxy()
        with Load(ks.proxy_port) as load:
            load.wait_served(time.monotonic(), 30)
            phases: list[tuple[str, float, float]] = []  # (what, killed at, serving again after)

            time.sleep(rng.uniform(2, 4))  # the fault's random instant (not a wait)
            victim = rng.choice(ks.replica_pids("faults", "Recorder"))
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            phases.append(("replica", killed, load.wait_served(killed, 30)))
            wait_for(
                lambda: (
                    len(ks.replica_pids("faults", "Recorder")) == 3
                    and victim not in ks.replica_pids("faults", "Recorder")
                ),
                60,
                what="the killed replica to be replaced",
            )
            figures.append(f"replica replaced after {time.monotonic() - killed:.2f} s")

            time.sleep(rng.uniform(2, 4))
            proxy_pid = int(next(iter(ks.details()["proxies"].values()))["worker_id"])
            killed = time.monotonic()
            os.kill(proxy_pid, signal.SIGKILL)
            phases.append(("proxy", killed, load.wait_served(killed, 30)))

            time.sleep(rng.uniform(2, 4))
            children = ks.all_pids()
            killed = time.monotonic()
            ks.stop(signal.SIGKILL)
            wait_for(lambda: not any(pid_alive(p) for p in children), 30, what="children to die")
            figures.append(f"controller's children gone {time.monotonic() - killed:.2f} s after")
            ks.start()
            phases.append(("controller", killed, load.wait_served(killed, 90)))
            time.sleep(rng.uniform(2, 4))  # load after the restart
        outcomes = load.outcomes
    finally:
        ks.stop()

    ran = executions(record)
    twice = {rid: n for rid, n in ran.items() if n > 1}
    answered = [o for o in outcomes if o.status == 200]
    lost = [o for o in outcomes if o.status != 200]
    figures.append(
        f"{len(outcomes)} requests, {len(answered)} answered 200, {len(lost)} lost "
        f"({dict(Counter(o.status for o in lost))} by status; 0 = no answer), "
        f"{len(twice)} executed twice"
    )
    bounds = [p[1] for p in phases] + [float("inf")]
    lost_while_serving: list[Outcome] = []
    for (what, killed, back), until in zip(phases, bounds[1:], strict=True):
        during = [o for o in lost if killed <= o.ended < until]
        figures.append(
            f"kill -9 {what}: serving again after {back:.2f} s; {len(during)} requests lost "
            f"({sum(1 for o in during if o.started < killed)} in flight at the kill)"
        )
        # Once serving again (plus half a second for the news of the kill to spread), nothing
        # may be lost until the next kill.
        lost_while_serving += [o for o in during if o.started > killed + back + 0.5]
    print("\nfault test figures:\n  " + "\n  ".join(figures))
    assert not twice, f"requests executed more than once: {list(twice.items())[:10]}"
    assert not lost_while_serving, f"lost while serving: {lost_while_serving[:5]}"
    assert all(ran[o.request_id] == 1 for o in answered)
    assert len(answered) > 100
