"""How the tests run the driver scripts of ``tests/drivers/ray_docs/`` (Ray's documentation
patterns) as their users run them, against ``kubeserve start`` or the operator on the node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.common import ROOT

DOCS = ROOT / "tests" / "drivers" / "ray_docs"
#: ``python -m kubeserve.compat FILE``, and ``python FILE`` with kubeserve's ``ray`` importable
WAYS = ("compat", "plain")


def driver_command(script: Path, way: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment a user runs ``script`` with, ``way`` one of :data:`WAYS`."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy")}
    env["PYTHONPATH"] = str(ROOT / "operator")
    if way == "compat":
        return [sys.executable, "-m", "kubeserve.compat", str(script)], env
    folder = subprocess.run(
        [sys.executable, "-m", "kubeserve.compat", "--pythonpath"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env["PYTHONPATH"] = os.pathsep.join([folder, env["PYTHONPATH"]])
    return [sys.executable, str(script)], env
