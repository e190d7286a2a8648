"""Ray's ``rolling_update_percentage`` and ``max_surge_percent`` on ``kubeserve start``.

A change of ``runtime_env.env_vars`` replaces every replica of a deployment of four while twelve
clients send requests through the proxy. Sampled from the details all along the roll: the live
replicas (starting or running, of either version) never exceed the target plus the surge, the
running ones never drop below the target less the replicas replaced at a time; no request fails;
``deployment_config`` reports the two knobs as set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.common import wait_for
from support.kubeserve_start import Kubeserve
from support.load import Load, failures

TARGET = 4


def recorder(record: Path, roll: str, **knobs: Any) -> dict[str, Any]:
    return {
        "name": "faults",
        "route_prefix": "/",
        "import_path": "fault_recorder:app",
        "runtime_env": {"env_vars": {"KS_FAULT_DIR": str(record), "KS_ROLL": roll}},
        "deployments": [{"name": "Recorder", "num_replicas": TARGET, **knobs}],
    }


def states(ks: Kubeserve) -> tuple[list[str], set[str]]:
    """The states of the deployment's replicas and the versions of the running ones."""
    app = ks.app("faults") or {"deployments": {}}
    replicas = app["deployments"].get("Recorder", {"replicas": []})["replicas"]
    running = {r["replica_id"] for r in replicas if r["state"] == "RUNNING"}
    return [r["state"] for r in replicas], running


@pytest.mark.parametrize(
    ("knobs", "most", "fewest"),
    [
        # a surge of one (25% of 4), nothing unavailable
        ({"rolling_update_percentage": 0.5, "max_surge_percent": 25}, TARGET + 1, TARGET),
        # no surge: half of them at a time
        ({"rolling_update_percentage": 0.5, "max_surge_percent": 0}, TARGET, TARGET // 2),
    ],
    ids=["surge", "batch"],
)
def test_a_roll_keeps_within_the_surge_and_the_availability_and_fails_no_request(
    tmp_path: Path, knobs: dict[str, Any], most: int, fewest: int
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    ks = Kubeserve(tmp_path / "state")
    ks.start()
    try:
        assert ks.put([recorder(record, "1", **knobs)])[0] == 200
        ks.wait_app("faults", timeout_s=90)
        wait_for(lambda: states(ks)[0] == ["RUNNING"] * TARGET, 60, what="4 replicas running")
        config = ks.app("faults")["deployments"]["Recorder"]["deployment_config"]  # type: ignore[index]
        assert {k: config[k] for k in knobs} == knobs
        before = states(ks)[1]
        seen: list[list[str]] = []

        def rolled() -> bool:
            replica_states, running = states(ks)
            seen.append(replica_states)
            return replica_states == ["RUNNING"] * TARGET and not running & before

        with Load(ks.proxy_port) as load:
            assert ks.put([recorder(record, "2", **knobs)])[0] == 200
            wait_for(rolled, 120, interval_s=0.05, what="every replica replaced")
        live = [sum(s in ("STARTING", "RUNNING") for s in sample) for sample in seen]
        running = [sample.count("RUNNING") for sample in seen]
        failed = failures(load.outcomes)
        print(f"{knobs}: {len(load.outcomes)} requests, failed {failed}, "
              f"live {min(live)}..{max(live)}, running {min(running)}..{max(running)}")  # fmt: skip
        assert failed == {} and len(load.outcomes) > 100
        assert max(live) == most, seen
        assert min(running) >= fewest, seen
    finally:
        try:
            ks.shutdown()
        finally:
            ks.stop()  # the instance itself too, not only its applications
