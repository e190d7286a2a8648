"""A reference proxy for the bench: nginx in front of the same kubeserve replica.

The issue's own yardstick for "a proxy that works at the protocol level" is nginx, so the bench
measures it beside the kubeserve proxy, in the same turns, against the same replica: one worker
process (the kubeserve proxy is one process too), keep-alive connections to the replica, access
log off. nginx cannot reach the replica's abstract unix socket, so it uses the replica's TCP port.
nginx comes from Debian (``make bench`` installs ``nginx-light`` when missing); without it the
row is left out.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from systems import free_port, http

_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    upstream replica {{ server 127.0.0.1:{replica_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def master_pid(url: str) -> int:
    """The PID of the nginx serving ``url`` (its master; the worker is its child)."""
    return _masters[url]


_masters: dict[str, int] = {}


def version() -> str | None:
    binary = shutil.which("nginx")
    if binary is None:
        return None
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    return (out.stderr or out.stdout).strip().replace("nginx version: ", "")


@contextlib.contextmanager
def reference_proxy(replica_port: int) -> Iterator[str | None]:
    """The URL of an nginx proxying to the replica on ``127.0.0.1:replica_port`` (None: none)."""
    binary = shutil.which("nginx")
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="kubeserve-bench-nginx-") as tmp:
        port = free_port()
        (Path(tmp) / "nginx.conf").write_text(
            _CONF.format(dir=tmp, port=port, replica_port=replica_port)
        )
        proc = subprocess.Popen(
            [binary, "-p", tmp, "-c", f"{tmp}/nginx.conf"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    http("GET", url, timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"nginx did not start (see {tmp}/error.log)") from None
                    time.sleep(0.05)
            _masters[url] = proc.pid
            yield url
        finally:
            _masters.pop(url, None)
            proc.terminate()
            proc.wait(10)
