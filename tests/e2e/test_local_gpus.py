"""GPUs on one machine: each replica claiming ``num_gpus`` sees exactly the devices it was given
in ``CUDA_VISIBLE_DEVICES`` (whole devices, or a share of one: fractions pack together), as Ray
sets it for its actors. No GPU is needed: the devices are what ``kubeserve start`` was told it
has (``CUDA_VISIBLE_DEVICES`` and ``--num-gpus``), and replicas see the assignment in their
environment."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve


def gpu_app(replicas: int, num_gpus: float, **env: str) -> dict[str, Any]:
    options: dict[str, Any] = {"num_gpus": num_gpus, "num_cpus": 0}
    if env:
        options["runtime_env"] = {"env_vars": env}
    return {
        "name": "gpus",
        "route_prefix": "/gpus",
        "import_path": "ks_gpu_app:app",
        "deployments": [{"name": "Gpus", "num_replicas": replicas, "ray_actor_options": options}],
    }


def devices_of(pid: int) -> str | None:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
            return entry.partition(b"=")[2].decode()
    return None


def assigned(ks: Kubeserve, count: int) -> Counter[str | None]:
    pids = wait_for(
        lambda: p if len(p := ks.replica_pids("gpus", "Gpus")) == count else None,
        60,
        what=f"{count} replicas",
    )
    return Counter(devices_of(pid) for pid in pids)


def test_each_replica_sees_the_gpus_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7,9")
    with running_kubeserve(tmp_path / "state", args=("--num-gpus", "2")) as ks:
        # whole devices: the first two of the visible ones, one each
        assert ks.put([gpu_app(2, 1)])[0] == 200
        ks.wait_app("gpus")
        assert assigned(ks, 2) == Counter({"4": 1, "7": 1})
        status, body = http("GET", f"{ks.proxy}/gpus")
        assert status == 200 and body["devices"] in ("4", "7"), body
        # halves: two replicas share each device
        assert ks.put([gpu_app(4, 0.5)])[0] == 200
        wait_for(lambda: assigned(ks, 4) == Counter({"4": 2, "7": 2}), 60, what="halves")
        # a fifth half does not fit: it waits, saying why
        assert ks.put([gpu_app(5, 0.5)])[0] == 200
        message = wait_for(
            lambda: (
                "cannot be scheduled" in (m := ks.app("gpus")["deployments"]["Gpus"]["message"])
                and m
            ),
            60,
            what="the fifth replica to wait",
        )
        assert '"GPU": 0.5' in message, message
        # Ray's switch to leave the variable alone
        noset = gpu_app(1, 1, RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1")
        assert ks.put([noset])[0] == 200
        wait_for(lambda: assigned(ks, 1) == Counter({"4,7,9": 1}), 60, what="the inherited value")
        ks.shutdown()


def test_a_gpu_count_above_one_must_be_whole(tmp_path: Path) -> None:
    with running_kubeserve(tmp_path / "state", args=("--num-gpus", "2")) as ks:
        status, body = ks.put([gpu_app(1, 1.5)])
        assert status == 400, body
        assert "num_gpus above 1 must be a whole number" in str(body), body
        assert "ray_actor_options" in str(body), body
