"""Finding the processes of an earlier run: PID and start time, pidfds, and the held snapshot."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

from kubeserve.backends.local import processes
from kubeserve.backends.local.snapshot import SnapshotPublisher
from support.common import run


def test_a_reused_pid_is_not_taken_for_the_recorded_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = processes.start_time(child.pid)
        assert started is not None

        async def go() -> None:
            assert processes.AdoptedProcess.find(child.pid, started + 1) is None
            adopted = processes.AdoptedProcess.find(child.pid, started)
            assert adopted is not None and adopted.returncode is None
            adopted.send_signal(signal.SIGKILL)
            assert await asyncio.wait_for(adopted.wait(), 10) == -1  # not ours: code unknown
            assert adopted.returncode == -1

        run(go())
    finally:
        child.kill()
        child.wait()
    assert processes.AdoptedProcess.find(child.pid, started) is None  # gone, record or not


def test_a_new_run_holds_its_snapshot_until_the_earlier_replicas_are_adopted() -> None:
    async def go() -> None:
        earlier = SnapshotPublisher().current["version"]
        publisher = SnapshotPublisher()
        publisher.publish([{"route_prefix": "/", "app": "a", "deployment": "d"}], {})
        held = await publisher.wait(earlier, 0.05)
        assert held["version"] == earlier  # nothing new for a poller that has the earlier one
        publisher.open()
        snapshot = await publisher.wait(earlier, 0.05)
        assert snapshot["version"] > earlier  # never the version of an earlier run's snapshot

    run(go())
