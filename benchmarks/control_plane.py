"""Control-plane figures, measured the same way on every system through the admin REST API.

- PUT -> RUNNING of the composed example (the application did not exist before the PUT; between
  runs it is removed by a PUT without it, the serving layer itself keeps running);
- PUT -> first answer through the proxy;
- user_config change -> applied: PUT with a new greeting until the proxy answers with it;
- scale 1 -> 4: PUT with ``num_replicas: 4`` for the Greeter until four replicas run;
- Ray's quickstart driver script (``serve.run``): from the script's start to its first answer.

Timings poll every 5 ms, so they carry up to 5 ms of polling granularity.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from systems import ServeSystem, wait_for

COMPOSED = "composed"


@dataclass
class ControlPlane:
    deploy_s: list[float] = field(default_factory=list)
    first_answer_s: list[float] = field(default_factory=list)
    user_config_s: list[float] = field(default_factory=list)
    scale_s: list[float] = field(default_factory=list)
    driver_s: list[float] = field(default_factory=list)

    def medians(self) -> dict[str, float]:
        return {
            "PUT -> RUNNING (composed)": statistics.median(self.deploy_s),
            "PUT -> first answer via proxy": statistics.median(self.first_answer_s),
            "user_config change -> applied": statistics.median(self.user_config_s),
            "scale Greeter 1 -> 4 replicas": statistics.median(self.scale_s),
            DRIVER_STEP: statistics.median(self.driver_s),
        }


#: Ray's quickstart as a driver script: ``serve.run`` in the script, then one request.
QUICKSTART_DRIVER = Path(__file__).resolve().parent / "quickstart_driver.py"
DRIVER_STEP = "quickstart script start -> first answer (serve.run)"


def driver_first_answer(system: ServeSystem, script: Path = QUICKSTART_DRIVER) -> float:
    """Seconds from starting ``script`` (a fresh interpreter: imports, pickling, deploy, the
    wait for RUNNING) to its first answer through the proxy, which it prints; then its
    application is removed (not timed), so every run deploys afresh."""
    command, env = system.driver(script)
    with tempfile.TemporaryFile("w+") as log:  # Ray's driver logs a lot: kept out of the report
        start = time.perf_counter()
        with subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        ) as proc:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            answered = time.perf_counter() - start
            proc.stdout.read()
            proc.wait(60)
        if json.loads(line or "null") != {"sum": 5}:
            log.seek(0)
            raise RuntimeError(
                f"{system.name}: {script.name} answered {line!r} (exit {proc.returncode})\n"
                + log.read()[-4000:]
            )
    system.delete_app("quickstart")
    return answered


def composed_app(import_path: str, greeting: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "name": COMPOSED,
        "route_prefix": "/composed",
        "import_path": import_path,
        "deployments": [
            {"name": "Greeter", "num_replicas": replicas, "user_config": {"greeting": greeting}}
        ],
    }


def greeting(system: ServeSystem) -> str:
    return str(system.get("/composed?name=x", timeout=5)["message"])


def deploy(
    system: ServeSystem, base: list[dict[str, Any]], import_path: str
) -> tuple[float, float]:
    """(PUT -> RUNNING, PUT -> first correct answer through the proxy) of a fresh composed app."""
    start = time.perf_counter()
    system.put([*base, composed_app(import_path, "Hello")])
    wait_for(lambda: system.app_running(COMPOSED), 120)
    running = time.perf_counter() - start
    wait_for(lambda: greeting(system) == "Hello, x!", 60)
    return running, time.perf_counter() - start


def change_user_config(
    system: ServeSystem, base: list[dict[str, Any]], import_path: str, new: str
) -> float:
    start = time.perf_counter()
    system.put([*base, composed_app(import_path, new)])
    wait_for(lambda: greeting(system) == f"{new}, x!", 60, 0.002)
    return time.perf_counter() - start


def scale(
    system: ServeSystem, base: list[dict[str, Any]], import_path: str, greeting_: str, to: int
) -> float:
    start = time.perf_counter()
    system.put([*base, composed_app(import_path, greeting_, replicas=to)])
    system.wait_replicas(COMPOSED, "Greeter", to, 120)
    return time.perf_counter() - start


def remove(system: ServeSystem, base: list[dict[str, Any]]) -> None:
    system.put(base)
    wait_for(lambda: COMPOSED not in system.applications(), 120, 0.02)
