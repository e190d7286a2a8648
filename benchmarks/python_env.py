"""Time to RUNNING of an application whose runtime_env asks for one small package
(``pip: [inflection==0.5.1]``), cold and warm, on kubeserve and on Ray Serve 2.60, same run.

- cold: the first deploy on a fresh system. kubeserve gets an empty uv cache (``UV_CACHE_DIR``
  in a temporary directory), so the package is downloaded; Ray's pip plugin always downloads
  (``--no-cache-dir``) and makes a virtualenv.
- warm: the application deleted, then deployed again with the same runtime_env (kubeserve
  reuses the environment it keeps for ``--runtime-env-keep-s``; Ray its cached virtualenv).
- baseline: a no-op application without a runtime_env, on the same system just before.
- rebuilt (kubeserve only): a spec whose environment is gone but whose wheel is in uv's cache
  (``pip_check`` makes it a distinct spec): resolve and hard links.

Each figure is the time from the PUT until the application is RUNNING and its route answers.
Usage: ``python benchmarks/python_env.py [--ray-venv ~/.cache/kubeserve/ray-2.60.0]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from systems import (
    BENCH_DIR,
    Kubeserve,
    RayServe,
    ServeSystem,
    pids_matching,
    serve_bench_apps,
    wait_for,
)

PACKAGE = "inflection==0.5.1"


def _app(name: str, runtime_env: dict[str, Any]) -> dict[str, Any]:
    route = f"/{name}"
    return {
        "name": name,
        "route_prefix": route,
        "import_path": "pip_app:app",
        "runtime_env": runtime_env,
    }


class OwnRayServe(RayServe):
    """Ray's head stopped by the PIDs of its own processes (their command lines name its temp
    directory), not ``ray stop``, which stops every Ray on the machine; token authentication off
    (Ray 2.60 turns it on when ``~/.ray/auth_token`` exists, and the bench's requests carry none).
    """

    def __init__(self, venv: Path) -> None:
        super().__init__(venv)
        self.env["RAY_AUTH_MODE"] = "disabled"

    def stop(self) -> None:
        mine = pids_matching(self._temp)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in mine:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in mine):
                time.sleep(0.1)


def time_to_running(system: ServeSystem, app: dict[str, Any], timeout: float = 600) -> float:
    started = time.monotonic()
    system.put([app])
    name = app["name"]
    wait_for(lambda: system.app_running(name), timeout, 0.02)
    wait_for(lambda: bool(system.get(app["route_prefix"], timeout=5)), 60, 0.02)
    return time.monotonic() - started


def delete_all(system: ServeSystem) -> None:
    system.put([])
    wait_for(lambda: not system.applications(), 120, 0.05)


def bench(system: ServeSystem, baseline_import: str, rebuilt: bool) -> dict[str, float]:
    figures: dict[str, float] = {}
    baseline = {"name": "noop", "route_prefix": "/noop", "import_path": baseline_import}
    figures["baseline_s"] = time_to_running(system, baseline)
    delete_all(system)
    pip = {"pip": [PACKAGE]}
    figures["cold_s"] = time_to_running(system, _app("camel", pip))
    delete_all(system)
    figures["warm_s"] = time_to_running(system, _app("camel", pip))
    delete_all(system)
    if rebuilt:
        spec = {"pip": {"packages": [PACKAGE], "pip_check": True}}
        figures["rebuilt_from_uv_cache_s"] = time_to_running(system, _app("camel", spec))
        delete_all(system)
    return figures


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Time to RUNNING, `runtime_env: {{pip: [{PACKAGE}]}}` ({results['machine']})",
        "",
        "| system | no runtime_env (s) | cold (s) | warm (s) | rebuilt from uv's cache (s) |",
        "|---|---|---|---|---|",
    ]
    for name, f in results["systems"].items():
        rebuilt = f.get("rebuilt_from_uv_cache_s")
        rebuilt_text = "-" if rebuilt is None else f"{rebuilt:.2f}"
        lines.append(
            f"| {name} | {f['baseline_s']:.2f} | {f['cold_s']:.2f} | {f['warm_s']:.2f} "
            f"| {rebuilt_text} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray-venv", type=Path, help="also run Ray Serve 2.60 from this venv")
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": serve_bench_apps(), "systems": {}}
    with tempfile.TemporaryDirectory(prefix="uv-cache-bench-") as uv_cache:
        os.environ["UV_CACHE_DIR"] = uv_cache  # kubeserve starts cold: nothing downloaded yet
        # each system is made when its turn comes: ports chosen minutes earlier may be taken
        makers: list[tuple[Callable[[], ServeSystem], str, bool]] = [(Kubeserve, "apps:noop", True)]
        if args.ray_venv is not None:
            venv = args.ray_venv
            makers.append((lambda: OwnRayServe(venv), "ray_apps:noop", False))
        for make, baseline, rebuilt in makers:  # one at a time: the other is not running
            system = make()
            try:
                system.start()
                results["systems"][system.name] = bench(system, baseline, rebuilt)
            finally:
                system.stop()
    results["machine"] += f", {os.getloadavg()[0]:.2f} at the end"
    (args.out / "results-python-env.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results-python-env.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
