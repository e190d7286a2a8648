"""Faults under load: kill -9 a replica, the proxy and the controller while clients send requests.

A real ``kubeserve start`` serves an application of three replicas that records each execution by
request id; 12 clients send requests with unique ``x-request-id`` values on keep-alive connections.
At random instants (seeded, printed) the test kills with SIGKILL: one replica, then the proxy, then
``kubeserve start`` itself (its replicas and proxy go on serving), which it starts again on the
same state directory.

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
from typing import Any

from kubeserve.backends.local.store import Store
from support.common import pid_alive, wait_for
from support.kubeserve_start import Kubeserve
from support.load import CLIENTS, Load, Outcome, longest_gap


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
            ks.start()
            wait_for(
                lambda: sorted(ks.all_pids()) == sorted(children), 30, what="the same processes"
            )
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


def recorder_app(record: Path, name: str = "faults", replicas: int = 2) -> dict[str, Any]:
    """The recording application, routed at ``/`` (``/<name>`` unless it is ``faults``)."""
    return {
        "name": name,
        "route_prefix": "/" if name == "faults" else f"/{name}",
        "import_path": "fault_recorder:app",
        "runtime_env": {"env_vars": {"KS_FAULT_DIR": str(record)}},
        "deployments": [{"name": "Recorder", "num_replicas": replicas}],
    }


def fault_figures(what: str, outcomes: list[Outcome], killed: float, record: Path) -> str:
    """Sent, failed (by status and error), run twice, and the longest time without a 200."""
    failed = [o for o in outcomes if o.status != 200]
    kinds = Counter(f"{o.status}:{o.error}" if o.error else str(o.status) for o in failed)
    twice = sum(1 for n in executions(record).values() if n > 1)
    gap = longest_gap(outcomes, killed - 1.0, max(o.ended for o in outcomes))
    return (
        f"{what}: {len(outcomes)} sent, {len(failed)} failed {dict(kinds)}, {twice} run twice, "
        f"longest gap without an answer {gap:.2f} s"
    )


def test_kill_9_of_kubeserve_start_fails_no_request_and_keeps_the_replicas(
    tmp_path: Path,
) -> None:
    """``kubeserve start`` killed outright under load and started again 3 s later: not one
    request fails, the same replica and proxy processes serve on, and the replica of an
    application deleted from the desired state meanwhile is stopped. The adopted proxy's
    listening socket went back to ``kubeserve start``: a kill -9 of that proxy afterwards
    refuses no connection either."""
    record = tmp_path / "record"
    record.mkdir()
    ks = Kubeserve(tmp_path / "state")
    ks.start()
    try:
        assert ks.put([recorder_app(record), recorder_app(record, "extra", 1)])[0] == 200
        ks.wait_app("faults", timeout_s=90)
        ks.wait_app("extra", timeout_s=90)
        before = sorted(ks.all_pids())
        extra = ks.replica_pids("extra", "Recorder")
        with Load(ks.proxy_port) as load:
            load.wait_served(time.monotonic(), 30)
            time.sleep(1)  # load before the kill
            killed = time.monotonic()
            ks.stop(signal.SIGKILL)
            store = Store(ks.state_dir / "kubeserve.db")  # deleted while nothing runs
            desired = store.load()
            assert desired is not None
            kept = [a.config for a in desired.applications if a.name != "extra"]
            store.replace(desired.options, kept, desired.single_app)
            store.close()
            time.sleep(3)  # down for 3 s, as an operator restarting it by hand
            ks.start()
            wait_for(lambda: not any(pid_alive(p) for p in extra), 30, what="extra to stop")
            ks.wait_app("faults", timeout_s=30)
            assert list(ks.details()["applications"]) == ["faults"]
            assert sorted(ks.all_pids()) == sorted(set(before) - set(extra))
            time.sleep(1)  # load after the restart
            proxy = int(next(iter(ks.details()["proxies"].values()))["worker_id"])
            proxy_killed = time.monotonic()
            os.kill(proxy, signal.SIGKILL)
            load.wait_served(proxy_killed, 30)
        outcomes = load.outcomes
    finally:
        ks.stop()
    until_proxy_kill = [o for o in outcomes if o.ended < proxy_killed]
    print("\n" + fault_figures("kill -9 kubeserve start", until_proxy_kill, killed, record))
    assert [o for o in until_proxy_kill if o.status != 200] == []
    after = [o for o in outcomes if o.ended >= proxy_killed and o.status != 200]
    assert len(after) <= CLIENTS and all(o.error != "ConnectionRefusedError" for o in after)
    assert all(n == 1 for n in executions(record).values())
    assert any(o.started > killed + 3 and o.status == 200 for o in outcomes)


def test_kill_9_of_the_proxy_refuses_no_connection_and_answers_no_404(tmp_path: Path) -> None:
    """The proxy killed outright under load: its successor takes over the same listening socket,
    so no connection is refused; it accepts only once it has its routes, so no 404; what fails
    is at most one request per client connection the killed proxy held."""
    record = tmp_path / "record"
    record.mkdir()
    ks = Kubeserve(tmp_path / "state")
    ks.start()
    try:
        assert ks.put([recorder_app(record)])[0] == 200
        ks.wait_app("faults", timeout_s=90)
        with Load(ks.proxy_port) as load:
            load.wait_served(time.monotonic(), 30)
            time.sleep(1)  # load before the kill
            proxy = int(next(iter(ks.details()["proxies"].values()))["worker_id"])
            killed = time.monotonic()
            os.kill(proxy, signal.SIGKILL)
            load.wait_served(killed, 30)
            ks.wait_proxy()
            time.sleep(1)  # load after the restart
        outcomes = load.outcomes
        assert int(next(iter(ks.details()["proxies"].values()))["worker_id"]) != proxy
    finally:
        ks.stop()
    print("\n" + fault_figures("kill -9 proxy", outcomes, killed, record))
    failed = [o for o in outcomes if o.status != 200]
    assert not [o for o in failed if o.error == "ConnectionRefusedError"], failed
    assert not [o for o in failed if o.status == 404], failed
    assert len(failed) <= CLIENTS, failed  # one per connection the killed proxy had open
    assert all(o.status == 0 for o in failed), failed
    assert all(n == 1 for n in executions(record).values())
