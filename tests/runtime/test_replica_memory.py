"""A real replica process of a plain no-op deployment, after serving traffic, its health check and
its metrics, has imported nothing heavy it does not use: no schema models or pydantic, no
Kubernetes client, no prometheus_client, no ASGI framework, grpcio, OpenTelemetry, websocket
library or YAML parser, no Ray-compatibility shims and no handle client, not even shutil or the
idna codec (its memory would grow by each; see the memory table in ``benchmarks/README.md``).

The process is the replica command itself (``python -m kubeserve.runtime.replica``, as ``kubeserve
start`` runs it), with one addition: a thread that, when the test writes a line to its stdin,
writes the names in ``sys.modules`` to a file. No timing is measured.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

from kubeserve.runtime import channel, wire
from support.channel_front import SECRET
from support.common import ROOT, free_port, wait_for
from support.lean_imports import DATA_PLANE_NEVER, loaded
from support.sealed_socket import sealed_socket

#: Runs the replica command, plus the thread that lists the process's modules on request.
_REPLICA = """
import json, os, runpy, sys, threading
def dump():
    sys.stdin.readline()
    path = os.environ['MODULES_OUT']
    with open(path + '.part', 'w') as out:
        json.dump(sorted(sys.modules), out)
    os.rename(path + '.part', path)
threading.Thread(target=dump, daemon=True).start()
sys.argv = ['kubeserve.runtime.replica', *sys.argv[1:]]
runpy.run_module('kubeserve.runtime.replica', run_name='__main__', alter_sys=True)
"""

#: Module prefixes a replica of a plain deployment must not load.
HEAVY = (
    *DATA_PLANE_NEVER,
    "kubeserve.compat.ray.serve",
    "kubeserve.runtime.router",
    "http.server",
)


def _request(port: int, path: str, role: channel.Role) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.sock = sealed_socket(port, role, SECRET, "r-1", 10)  # type: ignore[assignment]
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_replica_of_a_no_op_deployment_loads_nothing_heavy_after_serving(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = {
        "app": "default",
        "deployment": "Noop",
        "import_path": "benchmarks.apps:noop",
        "replica_id": "r-1",
        "user_config": None,
        "max_ongoing_requests": 5,
        "graceful_shutdown_wait_loop_s": 0.1,
        "graceful_shutdown_timeout_s": 5.0,
    }
    out = tmp_path / "modules.json"
    env = dict(os.environ)
    env.pop(wire.CONTROLLER_URL_ENV, None)
    env.update(
        {
            wire.REPLICA_CONFIG_ENV: json.dumps(config),
            channel.SECRET_ENV: SECRET.decode(),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
            "MODULES_OUT": str(out),
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:

        def healthy() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return _request(port, wire.HEALTHZ_PATH, channel.Role.CONTROL)[0] == 200

        wait_for(healthy, 30, what="the replica to be healthy", ignoring=(OSError,))
        for _ in range(20):
            assert _request(port, "/", channel.Role.INGRESS) == (200, b"ok")
        status, metrics = _request(port, wire.METRICS_PATH, channel.Role.CONTROL)
        assert status == 200 and b"kubeserve_replica_ongoing_requests" in metrics
        assert proc.stdin is not None
        proc.stdin.write(b"list\n")
        proc.stdin.flush()
        wait_for(out.exists, 10, what="the replica's list of modules")
        modules = json.loads(out.read_text())
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert "kubeserve.runtime.replica.server" in modules  # the list is of a real replica
    heavy = loaded(modules, HEAVY)
    assert not heavy, heavy
