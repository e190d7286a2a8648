"""A replica process as tests start one outside any controller: its config and environment."""

from __future__ import annotations

import json
import os
from typing import Any

from kubeserve.runtime import channel, wire
from support.channel_front import SECRET
from support.common import ROOT


def replica_config(import_path: str, deployment: str, **overrides: Any) -> wire.ReplicaConfig:
    """The config of replica ``r-1`` of ``deployment`` of app ``default`` (``overrides`` win)."""
    config: dict[str, Any] = {
        "app": "default",
        "deployment": deployment,
        "import_path": import_path,
        "replica_id": "r-1",
        "user_config": None,
        "max_ongoing_requests": 5,
        "graceful_shutdown_wait_loop_s": 0.1,
        "graceful_shutdown_timeout_s": 5.0,
        **overrides,
    }
    return config  # type: ignore[return-value]


def replica_env(
    config: wire.ReplicaConfig, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a replica of ``config`` holding the tests' data-plane secret and
    importing ``tests/apps``; without ``environ`` (the test's own environment) no controller."""
    env = dict(os.environ) if environ is None else dict(environ)
    env[wire.REPLICA_CONFIG_ENV] = json.dumps(config)
    env[channel.SECRET_ENV] = SECRET.decode()
    if environ is None:
        env.pop(wire.CONTROLLER_URL_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "tests" / "apps")])
    return env
