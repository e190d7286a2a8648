"""``kubeserve policy-host``: an application's custom autoscaling policies behind the data
plane's handshake, as the operator's policy host pod runs it (a real process, real channel)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kubeserve.runtime import channel, wire
from support.channel_front import SECRET
from support.common import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]

CONTEXT = {
    "current_num_replicas": 1,
    "target_num_replicas": 1,
    "running_replicas": ["pod-a"],
    "total_num_requests": 0.0,
    "total_queued_requests": 0.0,
    "capacity_adjusted_min_replicas": 1,
    "capacity_adjusted_max_replicas": 4,
    "last_scale_up_time": None,
    "last_scale_down_time": None,
    "current_time": 1000.0,
    "config": {"min_replicas": 1, "max_replicas": 4},
}


class PolicyHostProcess(NamedTuple):
    port: int
    proc: subprocess.Popen[bytes]


@pytest.fixture
def policy_host() -> Iterator[PolicyHostProcess]:
    port = free_port()
    env = dict(os.environ)
    env[channel.SECRET_ENV] = SECRET.decode()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "tests" / "apps")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubeserve.cli", "policy-host", "shop",
         "--import-path", "ray_policy_app:app", "--host", "127.0.0.1", "--port", str(port),
         "--identity", "shop-autoscaling-policy-x1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield PolicyHostProcess(port, proc)
    finally:
        proc.kill()
        proc.wait(10)


def ask(
    port: int,
    body: Any,
    *,
    secret: bytes = SECRET,
    identity: str = "shop-autoscaling-policy-x1",
    path: str = wire.AUTOSCALING_POLICY_PATH,
) -> tuple[int, Any]:
    async def call() -> tuple[int, bytes]:
        return await channel.request(
            "127.0.0.1", port, "POST", path, secret, identity, json.dumps(body).encode(),
            timeout_s=30,
        )  # fmt: skip

    status, answer = asyncio.run(call())
    return status, json.loads(answer) if status == 200 else answer.decode()


def listening(port: int) -> bool:
    try:
        return ask(port, {})[0] == 200
    except OSError:
        return False


def request(policy: str, **kwargs: Any) -> dict[str, Any]:
    spec = {"policy_function": policy, "policy_kwargs": kwargs}
    return {"scope": "deployment", "policy": spec, "contexts": {"Scaled": CONTEXT}}


def test_it_answers_the_policy_and_keeps_its_state(policy_host: PolicyHostProcess) -> None:
    port = policy_host.port
    wait_for(lambda: listening(port), 30, what="the policy host listening")
    status, answer = ask(port, request("ray_policy_app:FixedCount", count=3))
    assert (status, answer) == (200, {"decisions": {"Scaled": 3.0}})
    status, answer = ask(port, request("ray_policy_app:broken_policy"))
    assert status == 200 and "the policy exploded" in answer["error"]
    status, answer = ask(port, request("ray_policy_app:no_such_policy"))
    assert "cannot import policy_function" in answer["error"]


def test_only_the_instances_control_connections_are_answered(
    policy_host: PolicyHostProcess,
) -> None:
    port = policy_host.port
    wait_for(lambda: listening(port), 30, what="the policy host listening")
    with pytest.raises(channel.ChannelError):
        ask(port, request("ray_policy_app:FixedCount", count=3), secret=b"x" * 32)
    with pytest.raises((channel.ChannelError, ConnectionError)):
        ask(port, request("ray_policy_app:FixedCount", count=3), identity="another-pod")
    assert ask(port, {}, path="/elsewhere")[0] == 404


def test_a_hanging_policy_is_reported_and_the_process_exits(
    policy_host: PolicyHostProcess,
) -> None:
    port = policy_host.port
    wait_for(lambda: listening(port), 30, what="the policy host listening")
    assert ask(port, request("ray_policy_app:FixedCount", count=2))[0] == 200
    status, answer = ask(port, request("ray_policy_app:hanging_policy"))
    assert status == 200 and "did not answer within 10 s" in answer["error"]
    assert policy_host.proc.wait(10) == 3  # its supervisor (the kubelet) starts a fresh one
