"""Child processes of ``kubeserve start``: builds, replicas and the proxy.

Every child gets ``PR_SET_PDEATHSIG=SIGKILL`` so that no replica outlives a ``kubeserve start`` that
was killed outright; a normal stop terminates them gracefully first. Output goes to one log file per
process under the state directory (shown as ``log_file_path`` in the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now on ``host`` (the child binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def child_env(
    extra: Mapping[str, str], python_path: Sequence[str], base_dir: str | None = None
) -> dict[str, str]:
    """The environment of a child: ours, plus ``extra``, with ``python_path`` prepended.

    ``base_dir`` (the directory ``kubeserve start`` runs in) is importable too, as with
    ``serve run --app-dir .``, so ``import_path: examples.hello:app`` works from a checkout.
    """
    env = dict(os.environ)
    env.update(extra)
    paths = [*python_path]
    if base_dir:
        paths.append(base_dir)
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding kubeserve/
    paths.append(package_root)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


async def spawn(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: str | None = None,
) -> asyncio.subprocess.Process:
    """Start ``python -m module args...`` with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab", buffering=0) as log:  # noqa: ASYNC230 - a local file, opened once
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(env),
            cwd=cwd,
            preexec_fn=_die_with_parent,
        )


async def run_to_completion(
    module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: str | None, timeout_s: float
) -> tuple[int, str, str]:
    """Run ``python -m module args...`` and return (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        preexec_fn=_die_with_parent,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "", f"timed out after {timeout_s:.0f} s"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def terminate(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns once the process is gone."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def log_tail(path: Path, max_lines: int = 12) -> str:
    """The last lines of a child's log: what an operator needs to see first."""
    try:
        data = path.read_bytes()[-8192:]
    except OSError:
        return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return "\n".join(lines[-max_lines:])


async def wait_until_answering(
    probe: Callable[[], Awaitable[bool]],
    exited: asyncio.Future[int],
    still_wanted: Callable[[], bool],
    poll_s: float,
) -> bool:
    """Run ``probe`` until it answers True, or the process exits or is no longer wanted.

    Used for readiness: a child is ready once its health endpoint answers, which replicas only do
    after their constructor and first ``reconfigure`` succeeded.
    """
    while not exited.done() and still_wanted():
        if await probe():
            return True
        await asyncio.wait([exited], timeout=poll_s)
    return False


def http_probe(session: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[bool]]:
    """A readiness probe: ``GET url`` answers 200 within 5 s."""
    timeout = aiohttp.ClientTimeout(total=5)

    async def probe() -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=timeout) as response:
                return response.status == 200
        return False

    return probe
