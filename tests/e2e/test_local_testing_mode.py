"""``serve.run(..., _local_testing_mode=True)``: the application runs in the driver, no instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.common import ROOT, free_port


def test_a_driver_runs_its_application_in_process_without_an_instance(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "operator"),
        "KUBESERVE_ADDRESS": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "KUBESERVE_STATE_DIR": str(tmp_path / "no-instance"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "kubeserve.compat", str(ROOT / "tests/drivers/local_testing.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "answer": 13,
        "kept": [1, "changed"],
        "mine": [1],
        "streamed": [0, 1, 2],
        "same_process": True,
        "broken": "constructor failed",
        # as Ray 2.60's local testing mode raises them: the callee's own exception, unwrapped
        "errors": {
            "raised": ["ValueError", "refused 1"],
            "raised_through_ingress": ["TypeError", 'can only concatenate str (not "int") to str'],
            "no_such_method": [
                "RayServeException",
                "Tried to call a method 'nope' that does not exist. Available methods: "
                "['count', 'reconfigure', 'refuse', 'slow', 'times', 'where'].",
            ],
            "generator_not_streamed": [
                "TypeError",
                "Method 'count' returned a generator. You must use `handle.options(stream=True)` "
                "to call generators on a deployment.",
            ],
            "streamed_not_generator": [
                "TypeError",
                "Called method 'times' with `handle.options(stream=True)` but it did not return "
                "a generator.",
            ],
            "timeout": ["TimeoutError", "Timed out waiting for result."],
            "cancelled": ["RequestCancelledError", "Request was cancelled."],
        },
    }
