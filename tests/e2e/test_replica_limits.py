"""Each replica of ``kubeserve start`` is held to its memory and process limits.

``tests/apps/ks_limits_app.py`` goes over them on request. A replica with
``ray_actor_options={"memory": 200 MiB}`` that allocates beyond it is killed by the kernel and
restarted, and the deployment's status message names the limit (Ray's ``OutOfMemoryError``). A
replica that tries to start 10,000 processes is stopped by the process limit
(``--replica-max-processes``, small here), while the rest of the instance goes on serving; once the
application is deleted, none of its processes is left, not even those that left its process group.

Everything is capped so that nothing here can harm the shared machine even if a limit were not
enforced: the allocation stops at 600 MiB, the forks at 1,000 children (of the 10,000 asked
for) that sleep 60 s, and the test's teardown kills whatever carries the instance's marker.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve

MAX_PROCESSES = 64
MEMORY_LIMIT_TEXT = "memory limit of 200 MiB"


def cgroups_available() -> bool:
    text = Path("/proc/self/cgroup").read_text()
    return os.geteuid() == 0 and ("memory" in text or Path("/sys/fs/cgroup/memory.max").exists())


pytestmark = pytest.mark.skipif(
    not cgroups_available(), reason="needs root and the memory cgroup controller"
)


def instance_processes(state_dir: Path) -> list[int]:
    """Every process carrying the instance's marker (``KUBESERVE_INSTANCE``) in its environment:
    its proxy, replicas and all they started."""
    marker = f"KUBESERVE_INSTANCE={state_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    state_dir = tmp_path_factory.mktemp("limits").resolve()
    server = Kubeserve(state_dir, args=("--replica-max-processes", str(MAX_PROCESSES)))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        for pid in instance_processes(state_dir):  # strays, should any be left: none may run on
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def deploy(ks: Kubeserve, name: str) -> None:
    status, body = ks.put(
        [{"name": name, "route_prefix": f"/{name}", "import_path": f"ks_limits_app:{name}"}]
    )
    assert status == 200, body
    ks.wait_app(name)


def deployment_message(ks: Kubeserve, app: str, deployment: str) -> str:
    details: dict[str, Any] = ks.app(app) or {"deployments": {}}
    return str(details["deployments"].get(deployment, {}).get("message", ""))


def test_a_replica_over_its_memory_is_killed_and_restarted_saying_which_limit(
    limited: Kubeserve,
) -> None:
    ks = limited
    deploy(ks, "hog")
    (victim,) = ks.replica_pids("hog", "Hog")
    status, body = http("GET", f"{ks.proxy}/hog?mib=40", timeout=30)
    assert status == 200 and "holding 40 MiB" in body, (status, body)

    http("GET", f"{ks.proxy}/hog?mib=400", timeout=30)  # dies on the way: any answer
    ks.wait_replaced("hog", "Hog", victim)
    message = wait_for(
        lambda: (m := deployment_message(ks, "hog", "Hog")) and MEMORY_LIMIT_TEXT in m and m,
        30,
        what="the deployment's message to name the memory limit",
    )
    assert "OutOfMemoryError" in message and "ray_actor_options.memory = 209715200" in message
    assert MEMORY_LIMIT_TEXT in ks.log(), "the replica's death cause is logged"
    status, body = http("GET", f"{ks.proxy}/hog?mib=10", timeout=30)
    assert status == 200 and "holding 10 MiB" in body, "the restarted replica serves"


def test_a_fork_loop_stays_inside_its_replica(limited: Kubeserve) -> None:
    ks = limited
    deploy(ks, "forker")
    before = set(instance_processes(ks.state_dir))
    status, body = http("GET", f"{ks.proxy}/forker?n=10000", timeout=60)
    assert status == 200, body
    forked = set(instance_processes(ks.state_dir)) - before
    print(f"\nfork loop: {body}; {len(forked)} processes left running")
    assert 0 < body["started"] < MAX_PROCESSES
    assert "Resource temporarily unavailable" in body["error"]
    assert len(forked) <= MAX_PROCESSES

    # the instance serves on: a new application deploys and answers; the config no longer
    # lists ``forker``, so its replica is stopped
    deploy(ks, "hog")
    wait_for(
        lambda: http("GET", f"{ks.proxy}/hog?mib=10", timeout=30)[0] == 200,
        30,
        what="the new application to answer through the proxy",
    )
    wait_for(
        lambda: not any(_is_alive(pid) for pid in forked),
        30,
        what="every process of the fork loop to be gone (they left the replica's process group)",
    )


def _is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
