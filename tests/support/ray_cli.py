"""The real ``serve`` command-line client of Ray 2.60, run against a kubeserve admin API.

``make test`` installs ``ray[serve]==2.60.0`` into its own virtualenv and names its ``serve``
executable in ``KUBESERVE_RAY_SERVE``; tests that need it are marked :data:`needs_ray_serve`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

RAY_SERVE = os.environ.get("KUBESERVE_RAY_SERVE", "")

#: Skips a test (or a module, as ``pytestmark``) when the Ray client is not installed.
needs_ray_serve = pytest.mark.skipif(
    not RAY_SERVE or not Path(RAY_SERVE).exists(),
    reason="the Ray 2.60 serve client is installed by `make test` (KUBESERVE_RAY_SERVE)",
)


def run_serve(
    api: str, *args: str, token: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``serve ARGS -a API``; with ``token``, Ray's client sends it as its cluster token
    (``Authorization: Bearer``). The machine's own ``RAY_AUTH*`` settings are not passed on."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if token is not None:
        environ |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    return subprocess.run(
        [RAY_SERVE, *args, "-a", api],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **(env or {})},
    )


def serve(api: str, *args: str, token: str | None = None, env: dict[str, str] | None = None) -> str:
    """:func:`run_serve`, which must succeed; its standard output."""
    result = run_serve(api, *args, token=token, env=env)
    assert result.returncode == 0, (
        f"serve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout
