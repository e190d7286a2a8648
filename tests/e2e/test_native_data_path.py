"""``kubeserve start`` (``--data-path native``, the default): the proxy serves through
``kubeserve-fastpath`` (the native data path, ``make native``), a real instance end to end; where
the binary is missing (a ``pip install`` without the Rust build), the default serves on the Python
path, saying so once, and an explicit ``native`` is refused."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kubeserve.runtime.fastpath import DATA_PATH_ENV, MISSING_BINARY, find_binary
from support.common import ROOT, free_port, http, pid_alive, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve, slow_app


def proxy_pid(ks: Kubeserve) -> int:
    (proxy,) = ks.details()["proxies"].values()
    return int(proxy["worker_id"])


def native_pid(proxy: int) -> int | None:
    """The proxy's kubeserve-fastpath child, if it runs one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == proxy and exe.endswith("kubeserve-fastpath"):
            return int(entry.name)
    return None


def keep_alive_gets(port: int, path: str, count: int, extra: str = "") -> list[bytes]:
    """``count`` GETs of ``path`` (with ``extra`` header lines) on one connection; the answers'
    heads."""
    heads = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for _ in range(count):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += reader.readline()
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            reader.read(length)
            heads.append(head)
    return heads


def test_the_proxy_serves_through_the_native_data_path_and_survives_a_kill(tmp_path: Path) -> None:
    assert find_binary() is not None, "`make native` builds kubeserve-fastpath (`make test` does)"
    with running_kubeserve(tmp_path, args=("--data-path", "native")) as ks:
        status, body = ks.put([slow_app()])
        assert status == 200, body
        ks.wait_app("slow")
        proxy = proxy_pid(ks)
        native = native_pid(proxy)
        assert native is not None, "the proxy runs no kubeserve-fastpath"
        # started with glibc's malloc thresholds fixed (fastpath.ALLOCATOR_ENV), as proxy pods
        environ = Path(f"/proc/{proxy}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_MMAP_THRESHOLD_=65536" in environ, environ
        assert b"MALLOC_TRIM_THRESHOLD_=131072" in environ
        # the Python proxy behind it takes hand-offs on a unix socket only its user reaches: no
        # local process goes around the client port (its client-certificate check, say)
        argv = Path(f"/proc/{native}/cmdline").read_bytes().split(b"\0")
        fallback = argv[argv.index(b"--fallback") + 1].decode()
        assert fallback.startswith("unix:"), fallback
        private = Path(fallback.removeprefix("unix:"))
        assert private.is_socket() and private.parent.stat().st_mode & 0o777 == 0o700
        heads = keep_alive_gets(ks.proxy_port, "/slow?s=0", 20)
        assert all(h.startswith(b"HTTP/1.1 200") and b"x-request-id: " in h for h in heads)
        ids = [h.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode() for h in heads]
        # the proxy's access lines (Ray's format) hold the requests the native path answered
        (details,) = ks.details()["proxies"].values()
        log = Path(details["log_file_path"])
        wait_for(
            lambda: all(f" {rid} -- GET /slow 200 " in log.read_text() for rid in ids),
            10,
            what="the proxy's access lines of the natively answered requests",
        )
        # the rare cases are the Python proxy's: its own endpoints, an unknown route
        assert http("GET", f"{ks.proxy}/-/routes")[1] == {"/slow": "slow"}
        assert http("GET", f"{ks.proxy}/nowhere")[0] == 404
        # kill -9 the proxy: its native child leaves with it, the next proxy serves again
        os.kill(proxy, signal.SIGKILL)
        wait_for(lambda: not pid_alive(native), 10, what="kubeserve-fastpath to exit")
        wait_for(lambda: proxy_pid(ks) != proxy, 30, what="a new proxy")
        wait_for(lambda: native_pid(proxy_pid(ks)) is not None, 30, what="its native process")
        wait_for(lambda: http("GET", f"{ks.proxy}/slow?s=0")[0] == 200, 30, what="serving again")


def rss_kb(pid: int) -> int:
    """Resident set size of one process (kB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def many_connections_load(port: int, connections: int, rounds: int) -> int:
    """``connections`` keep-alive connections open at once, each sending a GET per round (all sent,
    then all answers read); how many 200 answers came back."""
    request = b"GET /slow?s=0 HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(connections)]
    readers = [sock.makefile("rb") for sock in socks]
    ok = 0
    try:
        for _ in range(rounds):
            for sock in socks:
                sock.sendall(request)
            for reader in readers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    assert line, "a connection closed mid-load"
                    head += line
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                reader.read(length)
                ok += head.startswith(b"HTTP/1.1 200")
    finally:
        for reader, sock in zip(readers, socks, strict=True):
            reader.close()
            sock.close()
    return ok


#: What the native process may hold once a load of many connections is over (it idles at ~4 MB;
#: generous, so a loaded machine does not make it flaky).
NATIVE_RSS_AFTER_LOAD_KB = 16 * 1024


def test_the_native_process_gives_memory_back_after_a_load_of_many_connections(
    tmp_path: Path,
) -> None:
    """256 keep-alive connections at once, 5,000 requests: every one lands in the proxy's access
    lines (however many a second of records holds), and once the connections close the native
    process's resident size comes back under a small bound (its buffers freed, and returned to
    the system)."""
    connections, rounds = 256, 20
    with running_kubeserve(tmp_path, args=("--data-path", "native")) as ks:
        status, body = ks.put([slow_app({"name": "Slow", "max_ongoing_requests": 512})])
        assert status == 200, body
        ks.wait_app("slow")
        native = native_pid(proxy_pid(ks))
        assert native is not None, "the proxy runs no kubeserve-fastpath"
        (details,) = ks.details()["proxies"].values()
        log = Path(details["log_file_path"])
        answered = lambda: log.read_text().count(" -- GET /slow 200 ")  # noqa: E731
        before = answered()
        assert many_connections_load(ks.proxy_port, connections, rounds) == connections * rounds
        wait_for(
            lambda: answered() >= before + connections * rounds,
            20,
            what="an access line for each request of the load",
        )
        wait_for(
            lambda: rss_kb(native) < NATIVE_RSS_AFTER_LOAD_KB,
            20,
            what=f"kubeserve-fastpath's RSS under {NATIVE_RSS_AFTER_LOAD_KB} kB after the load",
        )


def test_a_proxy_told_to_stop_drains_its_native_data_path_with_no_failed_request(
    tmp_path: Path,
) -> None:
    """A ``kubeserve proxy --data-path native --drain-timeout-s`` (as a cluster runs it) gets
    SIGTERM with requests in flight, natively served and handed to the Python proxy: every one is
    answered, then both processes exit."""
    with running_kubeserve(tmp_path, args=("--data-path", "native")) as ks:
        # room for every request at once (one at the cap may meet the other process's last
        # requests, which each sees within 50 ms; not what this test is about)
        status, body = ks.put([slow_app({"name": "Slow", "max_ongoing_requests": 16})])
        assert status == 200, body
        ks.wait_app("slow")
        port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT / "operator")
        env["KUBESERVE_DATA_PLANE_SECRET_FILE"] = str(tmp_path / "data-plane.secret")
        argv = [sys.executable, "-m", "kubeserve.runtime.proxy", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--controller-url", ks.api, "--data-path", "native"]
        argv += ["--drain-timeout-s", "20"]
        log = (tmp_path / "drained-proxy.log").open("wb")
        proxy = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/slow?s=0"
            wait_for(
                lambda: http("GET", url)[0] == 200, 30, what="the second proxy", ignoring=(OSError,)
            )
            native = native_pid(proxy.pid)
            assert native is not None, "the proxy runs no kubeserve-fastpath"
            with ThreadPoolExecutor(8) as pool:
                # in flight at SIGTERM: keep-alive requests the native path serves, and requests
                # it hands to the Python proxy (TE: a hop-by-hop header it leaves to it)
                native_gets = [pool.submit(keep_alive_gets, port, "/slow?s=2", 1) for _ in range(4)]
                handed = [
                    pool.submit(keep_alive_gets, port, "/slow?s=2", 1, "TE: trailers\r\n")
                    for _ in range(2)
                ]
                time.sleep(0.5)  # (each request is on its replica by then)
                proxy.send_signal(signal.SIGTERM)
                heads = [h for f in native_gets + handed for h in f.result(timeout=60)]
            assert len(heads) == 6
            assert all(h.startswith(b"HTTP/1.1 200") for h in heads), heads
            # answered after SIGTERM: each tells its client to go (Connection: close)
            assert all(b"connection: close" in h.lower() for h in heads), heads
            assert proxy.wait(30) == 0
            wait_for(lambda: not pid_alive(native), 10, what="kubeserve-fastpath to exit")
        finally:
            if proxy.poll() is None:
                proxy.kill()
                proxy.wait()
            log.close()


#: What the log says, once, when the default native data path falls back for want of the binary.
FALLBACK = "serving on the Python data path, not the default native one"


@pytest.fixture()
def default_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No data path chosen by the environment (a sweep may set one), no binary named."""
    monkeypatch.delenv(DATA_PATH_ENV, raising=False)
    monkeypatch.delenv("KUBESERVE_FASTPATH_BINARY", raising=False)


@pytest.fixture()
def without_binary(tmp_path: Path, default_environment: None) -> Path:
    """This checkout's package alone, as ``pip install`` puts it: no ``native/target`` beside
    it, and no ``kubeserve-fastpath`` on ``$PATH``."""
    assert shutil.which("kubeserve-fastpath") is None, "a kubeserve-fastpath is on $PATH"
    code = tmp_path / "installed"
    shutil.copytree(
        ROOT / "operator", code / "operator", ignore=shutil.ignore_patterns("__pycache__")
    )
    return code


def test_the_default_data_path_is_native(tmp_path: Path, default_environment: None) -> None:
    assert find_binary() is not None, "`make native` builds kubeserve-fastpath (`make test` does)"
    with running_kubeserve(tmp_path) as ks:
        status, body = ks.put([slow_app()])
        assert status == 200, body
        ks.wait_app("slow")
        assert native_pid(proxy_pid(ks)) is not None, "the proxy runs no kubeserve-fastpath"
        assert http("GET", f"{ks.proxy}/slow?s=0")[0] == 200
        assert FALLBACK not in ks.log()


def test_without_the_binary_the_default_serves_on_the_python_path_saying_so_once(
    tmp_path: Path, without_binary: Path
) -> None:
    with running_kubeserve(tmp_path / "state", code=without_binary) as ks:
        status, body = ks.put([slow_app()])
        assert status == 200, body
        ks.wait_app("slow")
        proxy = proxy_pid(ks)
        assert native_pid(proxy) is None
        argv = Path(f"/proc/{proxy}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--data-path") + 1] == b"python"
        assert http("GET", f"{ks.proxy}/slow?s=0")[0] == 200
        log = ks.log_path.read_text()
        assert log.count(FALLBACK) == 1, log
        assert "make native" in log
        # a proxy started with no --data-path (as a cluster's default runs it) falls back too
        port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests" / "apps"), str(without_binary / "operator")]
        )
        env["KUBESERVE_DATA_PLANE_SECRET_FILE"] = str(tmp_path / "state" / "data-plane.secret")
        argv2 = [sys.executable, "-m", "kubeserve.runtime.proxy", "--host", "127.0.0.1"]
        argv2 += ["--port", str(port), "--controller-url", ks.api]
        proxy_log = tmp_path / "proxy.log"
        with proxy_log.open("wb") as out:
            second = subprocess.Popen(argv2, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}/slow?s=0"
                wait_for(
                    lambda: http("GET", url)[0] == 200, 30, what="the proxy", ignoring=(OSError,)
                )
                assert native_pid(second.pid) is None
            finally:
                second.terminate()
                second.wait(30)
        assert proxy_log.read_text().count(FALLBACK) == 1, proxy_log.read_text()


def test_an_explicit_native_data_path_without_the_binary_is_refused(
    tmp_path: Path, without_binary: Path
) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(without_binary / "operator")
    start = [sys.executable, "-m", "kubeserve.cli", "start", "--state-dir", str(tmp_path / "s")]
    start += ["--dashboard-port", str(free_port()), "--http-port", str(free_port())]
    for argv, chosen_by_env in (([*start, "--data-path", "native"], False), (start, True)):
        answer = subprocess.run(
            argv,
            env={**env, DATA_PATH_ENV: "native"} if chosen_by_env else env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.returncode == 2, answer
        assert f"--data-path native: {MISSING_BINARY}" in answer.stderr
    proxy = [sys.executable, "-m", "kubeserve.runtime.proxy", "--data-path", "native"]
    proxy += ["--controller-url", "http://127.0.0.1:9", "--port", str(free_port())]
    answer = subprocess.run(proxy, env=env, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 1, answer
    assert f"kubeserve proxy: --data-path native: {MISSING_BINARY}" in answer.stderr
