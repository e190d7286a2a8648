"""A replica's limits from its deployment's config, and the message of one killed over them."""

from __future__ import annotations

from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.replica_limits import (
    DEFAULT_MAX_PROCESSES,
    ReplicaLimits,
    out_of_memory_message,
    replica_limits,
)


def test_memory_comes_from_ray_actor_options_and_processes_from_the_instance() -> None:
    config = EffectiveDeployment(name="Model", ray_actor_options={"memory": 200 * 1024**2})
    assert replica_limits(config, 64) == ReplicaLimits(200 * 1024**2, 64)
    assert replica_limits(EffectiveDeployment(name="Model"), DEFAULT_MAX_PROCESSES) == (
        ReplicaLimits(None, 1024)
    )
    assert ReplicaLimits(200 * 1024**2, 64).describe() == "memory 200 MiB, at most 64 processes"


def test_the_out_of_memory_message_names_the_limit_and_where_it_is_set() -> None:
    message = out_of_memory_message(
        "Model-1-abc", ReplicaLimits(200 * 1024**2, 64), "cgroup v1", 199 * 1024**2
    )
    assert message.startswith("OutOfMemoryError: replica Model-1-abc was killed due to")
    assert "memory limit of 200 MiB (it used up to 199 MiB)" in message
    assert "ray_actor_options.memory = 209715200 bytes, enforced by cgroup v1" in message
    unlimited = out_of_memory_message("Model-1-abc", ReplicaLimits(None, 64), "OOMKilled", None)
    assert "node running low on memory" in unlimited
