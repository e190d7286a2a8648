"""The instance's resource ledger and what ``kubeserve start`` advertises by default."""

from __future__ import annotations

import os

import pytest

from kubeserve.backends.local.capacity import (
    MIN_DEFAULT_CPUS,
    Capacity,
    detect_gpus,
    instance_resources,
    machine_memory,
    memory_bytes,
)


def test_claims_are_held_until_released_and_start_slots_until_started() -> None:
    capacity = Capacity({"CPU": 4, "GPU": 1}, start_slots=2)
    capacity.take({"CPU": 1, "GPU": 1})
    capacity.take({"CPU": 0.5, "GPU": 0})
    assert capacity.free() == {"CPU": 2.5, "GPU": 0.0}
    assert capacity.free_start_slots() == 0
    capacity.started()
    assert capacity.free_start_slots() == 1
    capacity.release({"CPU": 1, "GPU": 1})
    assert capacity.free() == {"CPU": 3.5, "GPU": 1.0}


def test_flags_win_over_what_the_machine_has() -> None:
    assert instance_resources(2, 3, {"slot": 1}, 5e9) == {
        "CPU": 2.0,
        "GPU": 3.0,
        "memory": 5e9,
        "slot": 1.0,
    }


def test_the_default_memory_is_the_machines_or_the_cgroups_limit() -> None:
    memory = instance_resources(None, 0)["memory"]
    assert 0 < memory <= memory_bytes()[1]
    assert memory == machine_memory()


def test_the_default_cpu_count_is_the_machines_but_at_least_the_floor() -> None:
    cpus = instance_resources(None, 0)["CPU"]
    assert cpus == max(os.cpu_count() or 1, MIN_DEFAULT_CPUS)


def test_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert detect_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == 0
