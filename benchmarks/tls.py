"""HTTPS through the kubeserve proxy vs nginx terminating TLS, same run, runs in turns.

    .venv/bin/python benchmarks/tls.py [--runs 5] [--seconds 5] [--json OUT]

``kubeserve start`` serves ``compare_apps:async_noop`` (1 replica) with ``http_options.ssl_*``
(a P-256 certificate from a test CA); nginx (one worker, TLS on the same certificate, keep-alive
to its upstream, as :mod:`nginx`) sits in front of a plain replica of the same code
(:mod:`plain_replica`: nginx cannot do the data-plane handshake). Rows, each with and without
``Connection: close`` (wrk then opens a new connection, a full handshake, per request): the proxy
over HTTPS, nginx over HTTPS, and the proxy over plain HTTP in a second ``kubeserve start`` for
what TLS costs. Medians of runs taken in turns (run 1 of every row, then run 2...), so every row
sees the same background load; CPU us per request of the front process (proxy / nginx worker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import load
import plain_replica
from load import children
from systems import free_port

from support.kubeserve_start import Kubeserve
from support.tls_certs import Authority, Pair

APP = {"name": "tls", "route_prefix": "/", "import_path": "benchmarks.compare_apps:async_noop"}
NEW_CONNECTION = ("Connection: close",)

_NGINX = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream replica {{ server 127.0.0.1:{replica_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_session_cache off;
        ssl_session_tickets off;
        location / {{
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx_tls(replica_port: int, pair: Pair) -> Iterator[tuple[str, int]]:
    """nginx terminating TLS in front of ``127.0.0.1:replica_port``: its URL and worker PID."""
    binary = shutil.which("nginx")
    if binary is None:
        raise RuntimeError("nginx is not installed")
    with tempfile.TemporaryDirectory(prefix="kubeserve-bench-nginx-tls-") as tmp:
        port = free_port()
        conf = _NGINX.format(
            dir=tmp, port=port, replica_port=replica_port, cert=pair.cert, key=pair.key
        )
        (Path(tmp) / "nginx.conf").write_text(conf)
        proc = subprocess.Popen(
            [binary, "-p", tmp, "-c", f"{tmp}/nginx.conf"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not children(proc.pid):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"nginx did not start (see {tmp}/error.log)")
                time.sleep(0.05)
            yield f"https://127.0.0.1:{port}/", children(proc.pid)[0]
        finally:
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def kubeserve(
    state: Path, pair: Pair | None, args: tuple[str, ...] = ()
) -> Iterator[tuple[str, int]]:
    """``kubeserve start`` (with ``args``) serving the app, over HTTPS with ``pair``: its URL and
    proxy PID."""
    ks = Kubeserve(state, args=args)
    ks.start()
    try:
        options = {"host": "127.0.0.1", "port": ks.proxy_port}
        if pair is not None:
            options |= {"ssl_certfile": str(pair.cert), "ssl_keyfile": str(pair.key)}
        status, body = ks.put([APP], http_options=options)
        assert status == 200, body
        ks.wait_app("tls")
        (proxy,) = ks.details()["proxies"].values()
        scheme = "https" if pair is not None else "http"
        yield f"{scheme}://127.0.0.1:{ks.proxy_port}/", int(proxy["worker_id"])
    finally:
        ks.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="kubeserve-bench-tls-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        pair = Authority(Path(tmp) / "ca").issue("server")
        https_url, proxy_pid = stack.enter_context(kubeserve(Path(tmp) / "https", pair))
        http_url, plain_proxy_pid = stack.enter_context(kubeserve(Path(tmp) / "http", None))
        replica = stack.enter_context(
            plain_replica.running("benchmarks.compare_apps:async_noop", "AsyncNoop", free_port())
        )
        nginx_url, worker = stack.enter_context(
            nginx_tls(int(replica.url.rsplit(":", 1)[1].strip("/")), pair)
        )
        rows = {
            "proxy https keep-alive": (https_url, (), proxy_pid),
            "nginx https keep-alive": (nginx_url, (), worker),
            "proxy http keep-alive": (http_url, (), plain_proxy_pid),
            "proxy https new connections": (https_url, NEW_CONNECTION, proxy_pid),
            "nginx https new connections": (nginx_url, NEW_CONNECTION, worker),
            "proxy http new connections": (http_url, NEW_CONNECTION, plain_proxy_pid),
        }
        runs: dict[str, list[load.Run]] = {name: [] for name in rows}
        for url, headers, _ in rows.values():
            load.wrk(url, 1, headers=headers)
        for _ in range(args.runs):
            for name, (url, headers, pid) in rows.items():
                runs[name].append(load.wrk(url, args.seconds, headers=headers, pids=(pid,)))
    medians = {}
    print("| row | req/s | p99 ms | CPU us/req (front) | errors |\n|---|---|---|---|---|")
    for name, its_runs in runs.items():
        median = {
            "requests_per_s": statistics.median(r.requests_per_s for r in its_runs),
            "p99_ms": statistics.median(r.p99_ms for r in its_runs),
            "cpu_us": statistics.median(r.cpu_us or 0.0 for r in its_runs),
            "errors": sum(r.errors for r in its_runs),
            "runs": [r.requests_per_s for r in its_runs],
        }
        medians[name] = median
        print(
            f"| {name} | {median['requests_per_s']:.0f} | {median['p99_ms']:.2f} "
            f"| {median['cpu_us']:.1f} | {median['errors']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(medians, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
