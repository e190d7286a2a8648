"""``kubeserve run module:app --reload``: one application for development, reloaded on change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.common import free_port, http, wait_for

APP = """
from kubeserve import Request, deployment


@deployment
class Dev:
    async def __call__(self, request: Request) -> str:
        return "{answer}"


app = Dev.bind()
"""


def test_run_serves_the_app_reloads_on_change_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    source = tmp_path / "devapp.py"
    source.write_text(APP.format(answer="v1"))
    http_port, admin_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "kubeserve.cli", "run", "devapp:app", "--reload",
        "--http-port", str(http_port), "--dashboard-port", str(admin_port),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBESERVE_STATE_DIR"}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []

    def collect() -> None:
        assert proc.stdout is not None
        lines.extend(proc.stdout)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{http_port}/"
    try:
        wait_for(lambda: "default: RUNNING  Dev 1/1 HEALTHY\n" in lines, 120, what="RUNNING")
        assert f"kubeserve run: devapp:app at {url}\n" in lines
        assert http("GET", url) == (200, "v1")
        details = http("GET", f"http://127.0.0.1:{admin_port}/api/serve/applications/")[1]
        state_dir = Path(details["controller_info"]["log_file_path"]).parent.parent

        time.sleep(0.05)  # a new modification time, whatever the filesystem's resolution
        source.write_text(APP.format(answer="v2 reloaded"))
        wait_for(lambda: "kubeserve run: source changed, reloading\n" in lines, 30, what="reload")
        wait_for(lambda: http("GET", url) == (200, "v2 reloaded"), 120, what="the new code")

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert not state_dir.exists()  # the temporary state directory is gone with the instance
