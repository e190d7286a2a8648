"""Hostile input and faults on one machine: nothing runs, leaks or drops that should not.

A real ``kubeserve start`` with real replica processes; each test says which promise it checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

from kubeserve.backends.local.deployment_state import DISCOVERY_SETTLE_S
from support.common import ROOT, free_port, http, pid_alive, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve

SIZED = {"name": "sized", "route_prefix": "/sized", "import_path": "ks_hygiene_app:sized"}
SPAWNER = {"name": "spawner", "route_prefix": "/spawner", "import_path": "ks_hygiene_app:spawner"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def test_a_1_mib_user_config_survives_a_replica_restart(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    small = {"blob": "a"}
    ks.put([{**SIZED, "deployments": [{"name": "Sized", "user_config": small}]}])
    ks.wait_app("sized")
    big = {"blob": "x" * (1 << 20)}
    # a live change first: the replica restarted afterwards must start with this one
    assert ks.put([{**SIZED, "deployments": [{"name": "Sized", "user_config": big}]}])[0] == 200
    wait_for(
        lambda: http("GET", f"{ks.proxy}/sized")[1]["digest"] == _digest(big),
        60,
        what="the 1 MiB user_config applied",
    )
    ks.wait_app("sized")
    (victim,) = ks.replica_pids("sized", "Sized")
    # the config reached the replica in an in-memory file, never on the disk, which the replica
    # closed once read (its user code does not inherit it)
    assert not (ks.state_dir / "run").exists()
    held = [os.readlink(fd) for fd in Path(f"/proc/{victim}/fd").iterdir()]
    assert not [target for target in held if "kubeserve-replica" in target], held
    os.kill(victim, signal.SIGKILL)
    ks.wait_replaced("sized", "Sized", victim)
    ks.wait_app("sized")
    answer = http("GET", f"{ks.proxy}/sized")[1]
    assert answer["digest"] == _digest(big) and answer["pid"] != victim, answer
    ks.shutdown()


def test_state_dir_database_and_logs_are_private(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([SIZED])
    ks.wait_app("sized")
    assert _mode(ks.state_dir) == 0o700
    assert _mode(ks.state_dir / "logs") == 0o700
    database = ks.state_dir / "kubeserve.db"
    for path in (
        database,
        database.with_name("kubeserve.db-wal"),
        ks.state_dir / "kubeserve.db-shm",
    ):
        assert _mode(path) == 0o600, path
    logs = list((ks.state_dir / "logs").iterdir())
    assert any(p.name.startswith("replica_sized_") for p in logs), logs
    assert any(p.name == "proxy.log" for p in logs), logs
    for path in logs:
        assert _mode(path) == 0o600, path


def test_an_existing_loose_state_dir_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "loose"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    (state / "logs").mkdir(mode=0o777)
    os.chmod(state / "logs", 0o777)
    (state / "kubeserve.db").touch()
    os.chmod(state / "kubeserve.db", 0o644)
    with running_kubeserve(state):
        assert _mode(state) == 0o700
        assert _mode(state / "logs") == 0o700
        assert _mode(state / "kubeserve.db") == 0o600


def _spawned_child(ks: Kubeserve) -> tuple[int, int]:
    ks.wait_app("spawner")
    answer = http("GET", f"{ks.proxy}/spawner")[1]
    assert pid_alive(answer["child"]), answer
    return int(answer["pid"]), int(answer["child"])


def test_what_a_replica_started_dies_on_delete(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([SPAWNER])
    _, child = _spawned_child(ks)
    ks.shutdown()
    wait_for(lambda: not pid_alive(child), 30, what="the replica's child to die with it")


def test_what_a_replica_started_dies_when_it_is_killed_and_replaced(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    ks.put([SPAWNER])
    replica, child = _spawned_child(ks)
    os.kill(replica, signal.SIGKILL)
    wait_for(lambda: not pid_alive(child), 30, what="the killed replica's child to die")
    ks.wait_replaced("spawner", "Spawner", replica)
    _, new_child = _spawned_child(ks)
    assert new_child != child


def test_what_replicas_started_dies_when_kubeserve_stops(tmp_path: Path) -> None:
    with running_kubeserve(tmp_path / "state") as ks:
        ks.put([SPAWNER])
        _, child = _spawned_child(ks)
        assert ks.stop() == 0
        assert not pid_alive(child)


def test_leftovers_of_a_killed_kubeserve_are_killed_at_the_next_start(tmp_path: Path) -> None:
    """A replica outlives a ``kubeserve start`` killed outright (it would be adopted); one that
    died meanwhile is not, and what it started is killed by the next start."""
    with running_kubeserve(tmp_path / "state") as ks:
        ks.put([SPAWNER])
        replica, child = _spawned_child(ks)
        ks.stop(signal.SIGKILL)
        assert pid_alive(replica) and pid_alive(child)  # the data plane outlives it
        os.kill(replica, signal.SIGKILL)
        wait_for(lambda: not pid_alive(replica), 30, what="the replica to die")
        assert pid_alive(child)  # nothing kills what a replica started but the next start
        ks.start()
        assert not pid_alive(child)
        ks.wait_app("spawner")
        ks.shutdown()


def _replica_starts(ks: Kubeserve, app: str) -> int:
    return sum(1 for p in (ks.state_dir / "logs").iterdir() if p.name.startswith(f"replica_{app}_"))


def _starts_within(ks: Kubeserve, app: dict[str, str], window_s: float) -> int:
    ks.put([app])
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:  # a fixed observation window: what is measured is a rate
        time.sleep(0.5)
    return _replica_starts(ks, app["name"])


def test_a_replica_failing_at_once_is_restarted_with_backoff(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    app = {"name": "crash", "route_prefix": "/crash", "import_path": "ks_hygiene_app:crash_at_once"}
    starts = _starts_within(ks, app, 8.0)
    assert 2 <= starts <= 6, starts
    assert ks.app("crash")["status"] == "DEPLOY_FAILED"


def test_a_replica_crashing_once_ready_is_restarted_with_backoff(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    app = {
        "name": "flaky",
        "route_prefix": "/flaky",
        "import_path": "ks_hygiene_app:crash_when_ready",
    }
    starts = _starts_within(ks, app, 8.0)
    assert 2 <= starts <= 6, starts
    # Between two crashes the restarted replica may be ready (and the message cleared): the next
    # crash, within the backoff, names the exit again.
    wait_for(
        lambda: (
            "exited unexpectedly with code 4"
            in _deployment(ks, "flaky", "CrashWhenReady")["message"]
        ),
        30,
        what="the crash to be named in the deployment's message",
    )


def test_a_build_no_longer_wanted_is_killed(clean_kubeserve: Kubeserve, tmp_path: Path) -> None:
    ks = clean_kubeserve
    pid_file = tmp_path / "build.pid"
    slow = {
        "name": "slow",
        "route_prefix": "/slow",
        "import_path": "ks_slow_import:app",
        "runtime_env": {"env_vars": {"KS_PID_FILE": str(pid_file)}},
    }
    ks.put([slow])
    build = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, what="the build"))
    assert pid_alive(build)
    ks.put([{**slow, "import_path": "ks_hygiene_app:sized"}])  # the hanging build is superseded
    wait_for(lambda: not pid_alive(build), 30, what="the superseded build to be killed")
    ks.wait_app("slow")
    pid_file.unlink()
    ks.put([{**slow, "import_path": "ks_slow_import:app"}])
    build = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, what="the build"))
    ks.shutdown()  # DELETE cancels it too
    wait_for(lambda: not pid_alive(build), 30, what="the build of a deleted app to be killed")


HELLO = {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"}


def test_delete_then_put_of_the_same_name_is_reported_from_the_new_deployment(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    ks.put([HELLO])
    ks.wait_app("hello")
    for _ in range(3):  # each round races the controller's pass differently
        old = set(ks.replica_pids("hello", "Hello"))
        assert old
        put_at = time.time()
        # DELETE, GET and PUT pipelined on one connection: all three reach the admin server
        # before the controller's next pass, the window in which stale state used to show.
        delete, after_delete, put = _pipelined(
            ks,
            [
                ("DELETE", "/api/serve/applications/", None),
                ("GET", "/api/serve/applications/", None),
                ("PUT", "/api/serve/applications/", ks.config([HELLO])),
            ],
        )
        assert delete[0] == 200 and put[0] == 200, (delete, put)
        gone = json.loads(after_delete[1])["applications"].get("hello")
        assert gone is None or gone["status"] != "RUNNING", gone

        def new_incarnation_running(old: set[int] = old, put_at: float = put_at) -> bool:
            app = ks.app("hello")
            assert app is not None, "a PUT application is listed at once"
            if app["status"] != "RUNNING":
                return False
            pids = {r["pid"] for d in app["deployments"].values() for r in d["replicas"]}
            assert not pids & old, f"RUNNING reported from the deleted replicas: {app}"
            assert app["last_deployed_time_s"] >= put_at - 1, app
            return True

        wait_for(new_incarnation_running, 60, interval_s=0.01, what="the new hello RUNNING")
        assert http("GET", f"{ks.proxy}/hello")[0] == 200


def _pipelined(ks: Kubeserve, requests: list[tuple[str, str, object]]) -> list[tuple[int, bytes]]:
    """Send ``requests`` in one write on one keep-alive connection; (status, body) of each."""
    raw = b""
    for method, path, body in requests:
        data = b"" if body is None else json.dumps(body).encode()
        raw += (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode() + data
    with socket.create_connection(("127.0.0.1", ks.dashboard_port), timeout=30) as sock:
        sock.sendall(raw)
        reader = sock.makefile("rb")
        answers = []
        for _ in requests:
            status = int(reader.readline().split()[1])
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            answers.append((status, reader.read(length)))
        return answers


def test_overrides_of_missing_deployments_fail_the_app_naming_them(
    clean_kubeserve: Kubeserve,
) -> None:
    ks = clean_kubeserve
    composed = {"name": "composed", "route_prefix": "/", "import_path": "examples.composed:app"}
    ks.put([{**composed, "deployments": [{"name": "Gretter", "num_replicas": 2}]}])
    app = ks.wait_app("composed", "DEPLOY_FAILED")
    assert "Deployment 'Gretter' does not exist" in app["message"], app
    assert "'Greeter'" in app["message"], app
    ks.put([{**composed, "deployments": [{"name": "Greeter", "num_replicas": 2}]}])
    ks.wait_app("composed")


class _Traffic:
    """Clients sending GET requests in a loop over keep-alive connections, recording answers."""

    def __init__(self, ks: Kubeserve, path: str, clients: int = 4) -> None:
        self.ks, self.path = ks, path
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        conn = HTTPConnection("127.0.0.1", self.ks.proxy_port, timeout=30)
        while not self._stop.is_set():
            try:
                conn.request("GET", self.path)
                response = conn.getresponse()
                self.answers.append((response.status, response.read().decode(errors="replace")))
            except OSError as exc:
                self.answers.append((0, f"{type(exc).__name__}: {exc}"))
                conn.close()
                conn = HTTPConnection("127.0.0.1", self.ks.proxy_port, timeout=30)
        conn.close()

    def saw(self, predicate: Callable[[str], bool]) -> bool:
        return any(predicate(body) for status, body in self.answers[-20:] if status == 200)

    def stop(self) -> list[tuple[int, str]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return [(status, body) for status, body in self.answers if status != 200]


def test_a_rebuild_keeps_serving_until_the_new_version_runs(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([HELLO])
    ks.wait_app("hello")
    traffic = _Traffic(ks, "/hello")
    try:
        wait_for(lambda: traffic.saw(lambda b: b.startswith("hello, world")), 30, what="v1")
        # same ingress name, new code: the replicas roll
        ks.put([{**HELLO, "import_path": "ks_hello_v2:app"}])
        wait_for(lambda: traffic.saw(lambda b: b == "hello v2\n"), 60, what="v2 answers")
        ks.wait_app("hello")
        # another ingress: the route moves once the new graph is HEALTHY
        ks.put([{**HELLO, "import_path": "ks_hygiene_app:sized"}])
        wait_for(lambda: traffic.saw(lambda b: '"digest"' in b), 60, what="the new ingress")
        ks.wait_app("hello")
    finally:
        failures = traffic.stop()
    assert len(traffic.answers) > 50, len(traffic.answers)
    assert not failures, f"{len(failures)} of {len(traffic.answers)} failed: {failures[:5]}"
    # The previous graph's deployments stop for good once the route moved and settled: their
    # reconcile must not start again what the retirement stops (it once did, in a tight loop,
    # a new replica process every pass). Every replica process leaves a log file of its own.
    time.sleep(DISCOVERY_SETTLE_S + 2)
    started = len(list(ks.state_dir.rglob("replica_hello_*.log")))
    time.sleep(3)
    assert len(list(ks.state_dir.rglob("replica_hello_*.log"))) == started


def _deployment(ks: Kubeserve, app: str, name: str) -> dict[str, Any]:
    details = ks.app(app)
    assert details is not None
    return dict(details["deployments"].get(name) or {})


def test_replicas_that_do_not_fit_wait_and_say_why_and_a_restart_recovers(
    tmp_path: Path,
) -> None:
    with running_kubeserve(tmp_path / "state", args=("--num-cpus", "3", "--num-gpus", "0")) as ks:
        many = 1_000_000
        status, body = ks.put([{**SIZED, "deployments": [{"name": "Sized", "num_replicas": many}]}])
        if status == 400:  # the schema caps num_replicas: the largest count it accepts
            many = 400
            status, body = ks.put(
                [{**SIZED, "deployments": [{"name": "Sized", "num_replicas": many}]}]
            )
        assert status == 200, body
        for _ in range(2):  # before and after a restart with this state persisted
            wait_for(lambda: len(ks.replica_pids("sized", "Sized")) == 3, 60, what="3 replicas")
            sized = _deployment(ks, "sized", "Sized")
            assert sized["status"] == "UPDATING", sized
            assert f"has {many - 3} replicas that cannot be scheduled" in sized["message"], sized
            assert '{"CPU": 1.0}' in sized["message"], sized
            assert len(sized["replicas"]) == 3
            assert http("GET", f"{ks.proxy}/sized")[0] == 200
            assert ks.stop() == 0
            ks.start()
        gpu = {
            "name": "gpu",
            "route_prefix": "/gpu",
            "import_path": "ks_hygiene_app:spawner",
            "deployments": [{"name": "Spawner", "ray_actor_options": {"num_gpus": 1}}],
        }
        half = {"name": "Sized", "num_replicas": 6, "ray_actor_options": {"num_cpus": 0.5}}
        assert ks.put([{**SIZED, "deployments": [half]}, gpu])[0] == 200
        ks.wait_app("sized")  # six half-CPU replicas fit in three CPUs
        assert len(ks.replica_pids("sized", "Sized")) == 6
        spawner = wait_for(
            lambda: (
                (d := _deployment(ks, "gpu", "Spawner"))
                and "cannot be scheduled" in d.get("message", "")
                and d
            ),
            60,
            what="the GPU deployment to say why it waits",
        )
        assert '"GPU": 1.0' in spawner["message"] and not spawner["replicas"], spawner
        ks.shutdown()


def test_a_second_instance_on_the_same_state_dir_is_refused(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    ks.put([SPAWNER])
    replica, child = _spawned_child(ks)
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeserve.cli",
            "start",
            "--state-dir",
            str(ks.state_dir),
            "--dashboard-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "operator")},
    )
    assert second.returncode == 1
    assert "is using the state directory" in second.stderr, second.stderr
    assert pid_alive(replica) and pid_alive(child)  # the second one killed nothing


def _replica_processes(ks: Kubeserve) -> set[int]:
    """Every live replica process this instance started (its children running the replica)."""
    assert ks.proc is not None
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat_fields[1]) == ks.proc.pid and b"kubeserve.runtime.replica" in cmdline:
            found.add(int(entry.name))
    return found


def test_graphs_replaced_in_quick_succession_leave_no_replica_behind(
    clean_kubeserve: Kubeserve,
) -> None:
    """A driver per graph, each deploying as soon as the previous one runs (as Ray's docs scripts
    do one after another): the deployments each graph dropped stop, however soon the next graph
    came, even one that was still retiring when another graph dropped a deployment of its name."""
    ks = clean_kubeserve
    graphs = [
        "examples.hello:app",  # Hello
        "ks_hygiene_app:sized",  # Sized: Hello retires
        "ks_hello_v2:app",  # Hello again, a new version: Sized retires
        "ks_hygiene_app:spawner",  # Spawner: Hello retires again
        "examples.hello:app",  # Hello: Spawner retires
    ]
    for import_path in graphs:
        status, body = ks.put([{**HELLO, "import_path": import_path}])
        assert status == 200, body
        ks.wait_app("hello")
    wanted = set(ks.replica_pids("hello", "Hello"))
    assert len(wanted) == 1
    deadline = time.monotonic() + DISCOVERY_SETTLE_S + 30
    while _replica_processes(ks) != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _replica_processes(ks) == wanted, "a dropped deployment's replica still runs"


def test_a_retired_deployment_stops_while_a_newer_graph_still_builds(
    clean_kubeserve: Kubeserve, tmp_path: Path
) -> None:
    """Each retiring deployment stops ``DISCOVERY_SETTLE_S`` after the route left it, whatever
    newer graph is still starting (here a build that never ends): graphs deployed back to back
    once kept every dropped deployment running until some graph settled, and the pile of
    replicas starved the newest graph of CPU for good."""
    ks = clean_kubeserve
    ks.put([HELLO])
    ks.wait_app("hello")
    hello = ks.replica_pids("hello", "Hello")
    ks.put([{**HELLO, "import_path": "ks_hygiene_app:sized"}])  # the route moves to Sized
    ks.wait_app("hello")
    pid_file = tmp_path / "build.pid"
    env = {"env_vars": {"KS_PID_FILE": str(pid_file)}}
    ks.put([{**HELLO, "import_path": "ks_slow_import:app", "runtime_env": env}])
    wait_for(pid_file.exists, 30, what="the next graph's build")
    wait_for(
        lambda: not any(pid_alive(p) for p in hello),
        DISCOVERY_SETTLE_S + 20,
        what="the retired Hello replica to stop while the next build runs",
    )
    status, body = http("GET", f"{ks.proxy}/hello")
    assert status == 200 and "digest" in body, (status, body)  # Sized serves on


def test_a_new_version_that_does_not_fit_beside_the_previous_one_replaces_it(
    tmp_path: Path,
) -> None:
    """One CPU, one replica per version: the new graph's replica cannot start while the previous
    graph's holds the CPU, and the previous one would stop only once the new one serves. The
    previous one makes room instead of both waiting forever."""
    with running_kubeserve(tmp_path / "state", args=("--num-cpus", "1", "--num-gpus", "0")) as ks:
        ks.put([HELLO])
        ks.wait_app("hello")
        ks.put([{**HELLO, "import_path": "ks_hygiene_app:sized"}])
        ks.wait_app("hello", timeout_s=60)
        assert len(ks.replica_pids("hello", "Sized")) == 1
        status, body = http("GET", f"{ks.proxy}/hello")
        assert status == 200 and "digest" in body, (status, body)
        assert (
            "does not fit beside the previous one"
            in (ks.state_dir / "logs" / "controller.log").read_text()
        )
        ks.shutdown()


def test_max_replicas_per_node_caps_the_one_node_and_a_roll_at_the_cap_completes(
    clean_kubeserve: Kubeserve,
) -> None:
    """A kubeserve start instance is one node: replicas beyond ``max_replicas_per_node`` wait,
    saying why (Ray's stay pending on a one-node cluster); a new version at the cap replaces the
    old replicas one by one; raising the cap starts the rest."""
    ks = clean_kubeserve

    def sized(replicas: int, cap: int, **extra: Any) -> dict[str, Any]:
        deployment = {"name": "Sized", "num_replicas": replicas, "max_replicas_per_node": cap}
        return {**SIZED, "deployments": [{**deployment, **extra}]}

    assert ks.put([sized(3, 2)])[0] == 200
    wait_for(lambda: len(ks.replica_pids("sized", "Sized")) == 2, 60, what="2 replicas")
    waiting = wait_for(
        lambda: (
            (d := _deployment(ks, "sized", "Sized")) and "cannot be scheduled" in d["message"] and d
        ),
        30,
        what="the reason the third waits",
    )
    assert waiting["status"] == "UPDATING", waiting
    assert (
        "has 1 replica that cannot be scheduled: max_replicas_per_node is 2" in waiting["message"]
    )
    time.sleep(2)  # it stays at the cap
    assert len(ks.replica_pids("sized", "Sized")) == 2
    assert http("GET", f"{ks.proxy}/sized")[0] == 200

    assert ks.put([sized(2, 2)])[0] == 200  # at the cap: settles
    ks.wait_app("sized")
    before = set(ks.replica_pids("sized", "Sized"))
    assert (
        ks.put([sized(2, 2, user_config={"v": 2}, ray_actor_options={"num_cpus": 0.5})])[0] == 200
    )
    wait_for(
        lambda: (
            not before & set(ks.replica_pids("sized", "Sized"))
            and len(ks.replica_pids("sized", "Sized")) == 2
        ),
        90,
        what="the new version's two replicas at the cap",
    )
    ks.wait_app("sized")
    assert _deployment(ks, "sized", "Sized")["message"] == ""

    assert ks.put([sized(3, 3)])[0] == 200
    ks.wait_app("sized")
    assert len(ks.replica_pids("sized", "Sized")) == 3


def test_a_label_selector_the_node_does_not_satisfy_waits_and_says_why(tmp_path: Path) -> None:
    """``kubeserve start --labels`` gives the one node its labels, as ``ray start --labels``:
    a deployment whose ``label_selector`` they do not satisfy starts no replica and says why (a
    Ray replica stays pending); one they satisfy runs; a selector that is not one is a 400."""
    with running_kubeserve(tmp_path / "state", args=("--labels", "zone=a,pool=gpu")) as ks:

        def sized(selector: dict[str, str]) -> dict[str, Any]:
            options = {"label_selector": selector}
            return {**SIZED, "deployments": [{"name": "Sized", "ray_actor_options": options}]}

        status, body = ks.put([sized({"zone": "in(a"})])
        assert status == 400, body
        error = body["error"]
        assert "applications.0.deployments.0.ray_actor_options.label_selector: " in error, body
        assert "'zone': 'in(a' is not a node label condition" in error, body

        assert ks.put([sized({"zone": "b"})])[0] == 200
        waiting = wait_for(
            lambda: (d := _deployment(ks, "sized", "Sized")) and d.get("message") and d,
            30,
            what="the reason its replica waits",
        )
        assert waiting["status"] == "UPDATING", waiting
        assert 'label_selector {"zone": "b"} does not match' in waiting["message"], waiting
        assert '{"zone": "a", "pool": "gpu"}' in waiting["message"], waiting
        assert ks.replica_pids("sized", "Sized") == []

        assert ks.put([sized({"zone": "in(a, c)", "pool": "!cpu"})])[0] == 200
        ks.wait_app("sized")
        assert len(ks.replica_pids("sized", "Sized")) == 1
        assert http("GET", f"{ks.proxy}/sized")[0] == 200


def test_custom_resources_are_reserved_from_what_resources_gives_the_node(tmp_path: Path) -> None:
    """``kubeserve start --resources`` as ``ray start --resources``: replicas claiming a custom
    resource start while it lasts, the rest wait saying what they need; a node without it starts
    none."""
    args = ("--resources", '{"tpu_slot": 2}')
    with running_kubeserve(tmp_path / "state", args=args) as ks:

        def sized(replicas: int, resources: dict[str, float]) -> dict[str, Any]:
            options = {"resources": resources}
            deployment = {"name": "Sized", "num_replicas": replicas, "ray_actor_options": options}
            return {**SIZED, "deployments": [deployment]}

        assert ks.put([sized(3, {"tpu_slot": 1})])[0] == 200
        wait_for(lambda: len(ks.replica_pids("sized", "Sized")) == 2, 60, what="2 replicas")
        waiting = wait_for(
            lambda: (d := _deployment(ks, "sized", "Sized")) and d.get("message") and d,
            30,
            what="the reason the third waits",
        )
        assert "has 1 replica that cannot be scheduled" in waiting["message"], waiting
        assert '"tpu_slot": 1.0' in waiting["message"], waiting
        assert http("GET", f"{ks.proxy}/sized")[0] == 200

        assert ks.put([sized(2, {"other": 1})])[0] == 200
        wait_for(
            lambda: '"other": 1.0' in _deployment(ks, "sized", "Sized").get("message", ""),
            60,
            what="a resource the node does not have",
        )
        # no stop of the version serving makes room for what the node does not have
        time.sleep(2)
        assert len(ks.replica_pids("sized", "Sized")) == 2
        assert http("GET", f"{ks.proxy}/sized")[0] == 200


def test_memory_and_accelerator_type_are_reserved_as_on_a_one_node_ray_cluster(
    tmp_path: Path,
) -> None:
    """``ray_actor_options.memory`` reserves bytes of what ``kubeserve start --memory`` gives the
    node, and ``accelerator_type`` needs the node's ``accelerator_type:<type>`` resource (here
    from ``--resources``, as ``ray start --resources`` gives it): replicas that do not fit wait
    saying what they need, and a version the node can never hold leaves the serving one alone."""
    gb = 1_000_000_000
    args = ("--memory", str(3 * gb), "--resources", '{"accelerator_type:A100": 1}')
    with running_kubeserve(tmp_path / "state", args=args) as ks:

        def sized(replicas: int, options: dict[str, Any]) -> dict[str, Any]:
            deployment = {"name": "Sized", "num_replicas": replicas, "ray_actor_options": options}
            return {**SIZED, "deployments": [deployment]}

        assert ks.put([sized(4, {"memory": gb, "accelerator_type": "A100"})])[0] == 200
        wait_for(lambda: len(ks.replica_pids("sized", "Sized")) == 3, 60, what="3 replicas")
        waiting = wait_for(
            lambda: (d := _deployment(ks, "sized", "Sized")) and d.get("message") and d,
            30,
            what="the reason the fourth waits",
        )
        assert "has 1 replica that cannot be scheduled" in waiting["message"], waiting
        assert '"memory": 1000000000.0' in waiting["message"], waiting
        assert '"accelerator_type:A100": 0.001' in waiting["message"], waiting
        assert "--memory" in waiting["message"], waiting
        assert http("GET", f"{ks.proxy}/sized")[0] == 200

        assert ks.put([sized(3, {"accelerator_type": "H100"})])[0] == 200
        wait_for(
            lambda: (
                '"accelerator_type:H100": 0.001'
                in _deployment(ks, "sized", "Sized").get("message", "")
            ),
            60,
            what="an accelerator type the node does not have",
        )
        time.sleep(2)  # nothing of the version serving is stopped for one that can never fit
        assert len(ks.replica_pids("sized", "Sized")) == 3
        assert http("GET", f"{ks.proxy}/sized")[0] == 200

    # a bad --memory is refused at start, as ray start refuses it
    bad = subprocess.run(
        [sys.executable, "-m", "kubeserve.cli", "start", "--memory", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--memory" in bad.stderr, bad.stderr
