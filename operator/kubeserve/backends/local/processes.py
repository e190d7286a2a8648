"""Child processes of ``kubeserve start``: builds, replicas and the proxy.

Invariants:

* every child leads its own session and process group (``start_new_session``), so whatever it
  starts (a user's ``subprocess.Popen`` in a constructor) is in that group, and :func:`kill_group`
  ends all of it once the child is stopped, replaced, has crashed, or its build was cancelled;
* replicas and the proxy outlive a ``kubeserve start`` killed outright (the data plane goes on
  serving), and the next one on that state directory adopts them (:class:`AdoptedProcess`); only
  builds get ``PR_SET_PDEATHSIG=SIGKILL``, since a build's answer is for the process that asked;
* everything a child starts carries :data:`INSTANCE_ENV` in its environment, and
  :func:`kill_orphans` ends what was not adopted when that state directory is started again (or
  stopped);
* output goes to one 0600 log file per process under the state directory (``log_file_path`` in
  the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import aiohttp

from kubeserve.backends.local.private_files import open_private_log, private_dir
from kubeserve.runtime import logs, parent_death

#: Set in every child's environment to the instance's state directory; what a child starts
#: inherits it, which is how :func:`kill_orphans` recognises leftovers of this instance.
INSTANCE_ENV = "KUBESERVE_INSTANCE"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    parent_death.die_with_parent()


#: Builds are batch work: at this niceness a machine busy with them (8 at once importing their
#: applications) still gives the admin API and the controller's loop the CPU first.
BUILD_NICENESS = 10


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
    pass_fds: Sequence[int] = (),
    die_with_parent: bool = False,
    enter_limits: Callable[[], None] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``python -m module args...`` with stdout and stderr appended to ``log_path``.

    The child leads a session of its own and holds no pipe to this process; unless
    ``die_with_parent`` (a parent-death SIGKILL) it goes on when this process is killed outright.
    ``enter_limits`` runs in the child before exec (a replica joining its cgroups), so nothing
    the child runs escapes them.

    A log file that cannot be opened (a full disk refusing a new file) does not hold the start
    up: the child's output goes nowhere until its own log (``logs.RotatingOutput``) can write.
    """
    try:
        private_dir(log_path.parent)
        log = open_private_log(log_path)
    except OSError as exc:
        logs.record_dropped(str(log_path), exc, 0)
        log = os.open(os.devnull, os.O_WRONLY)
    try:
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
            preexec_fn=_child_setup(die_with_parent, enter_limits),
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        os.close(log)


def _child_setup(
    die_with_parent: bool, enter_limits: Callable[[], None] | None
) -> Callable[[], None] | None:
    """What runs in a child between fork and exec (nothing, when it can be started without)."""
    if not die_with_parent:
        return enter_limits
    if enter_limits is None:
        return _die_with_parent

    def setup() -> None:
        _die_with_parent()
        enter_limits()

    return setup


async def spawn_piped(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: str | None,
) -> asyncio.subprocess.Process:
    """Start ``python -m module args...`` talking over its stdin and stdout (lines up to 1 MiB),
    stderr appended to ``log_path``; it dies with this process and leads its own session, so
    :func:`kill_group` stops whatever it started."""
    private_dir(log_path.parent)
    log = open_private_log(log_path)
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=dict(env),
            cwd=cwd,
            preexec_fn=_die_with_parent,
            start_new_session=True,
            limit=1 << 20,
        )
    finally:
        os.close(log)


#: Threads that start builds and wait for them (a build's wait lasts as long as the build; the
#: controller's semaphore bounds how many run at once, well under this).
_BUILD_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="kubeserve-build")


async def run_to_completion(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout_s: float,
    stdin: bytes | None = None,
) -> tuple[int, str, str]:
    """Run ``python -m module args... --parent-pid <ours>`` with ``stdin`` (none: an empty one)
    at :data:`BUILD_NICENESS` and return (exit code, stdout, stderr).

    Started and waited for in a thread, and with no code run between fork and exec (``module``
    binds itself to this process: :func:`kubeserve.runtime.parent_death.die_with`): starting a
    process from the event loop held the loop until the child was scheduled, a third of a
    second each on a busy machine, for each of 1,000 applications of a large config.

    Whatever happens (completion, timeout, or the awaiting task being cancelled because the build
    is no longer wanted) the process and everything it started are killed before this returns.
    """
    loop = asyncio.get_running_loop()
    command = [sys.executable, "-m", module, *args, "--parent-pid", str(os.getpid())]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )

    proc = await loop.run_in_executor(_BUILD_THREADS, start)
    with contextlib.suppress(OSError):  # gone already: its exit code says why
        os.setpriority(os.PRIO_PROCESS, proc.pid, BUILD_NICENESS)
    try:
        out, err = await loop.run_in_executor(
            _BUILD_THREADS, functools.partial(proc.communicate, stdin, timeout_s)
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout_s:.0f} s"
    finally:
        kill_group(proc.pid)  # a cancelled wait's thread returns once the pipes close
        # shielded: a cancelled build must still be reaped, not left as a zombie
        await asyncio.shield(loop.run_in_executor(_BUILD_THREADS, proc.wait))
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


class Child(Protocol):
    """A replica or proxy process: our own child, or one adopted (:class:`AdoptedProcess`)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


async def terminate(proc: Child, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns once the process and its group are gone.

    Only the child itself gets SIGTERM (it drains its requests); what it started gets SIGKILL once
    it has exited, since nothing else would stop it.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    kill_group(proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group ``pgid`` (a child started with a new session).

    Called right after the child leading the group was reaped; a group id is not reused while any
    process is still in the group, so this never reaches a stranger.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_orphans(state_dir: Path, spared_groups: Collection[int] = ()) -> list[int]:
    """SIGKILL processes left over by an earlier run of the instance at ``state_dir``.

    They are recognised by ``INSTANCE_ENV=<state_dir>`` in their environment; processes in the
    groups ``spared_groups`` (adopted replicas and proxy, and what they started) are left alone.
    Call it only when this instance has no children of its own outside those groups (at start-up,
    and after every child was stopped). Returns the PIDs killed.
    """
    marker = f"{INSTANCE_ENV}={state_dir}".encode()
    killed: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            if os.getpgid(pid) in spared_groups:
                continue
        except OSError:  # gone, or another user's
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), or
    None when there is no such process: with the PID, it names one process for good (a PID is
    reused, the pair never is)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


class AdoptedProcess:
    """A replica or proxy started by an earlier ``kubeserve start``, watched through a pidfd.

    It is not our child, so it cannot be waited for: its exit is seen when its pidfd becomes
    readable, and its exit code is unknown (``returncode`` is -1 once it is gone). Offers what
    :func:`terminate` and the lifecycles use of :class:`asyncio.subprocess.Process`.
    """

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)

    @classmethod
    def find(cls, pid: int, started: int) -> AdoptedProcess | None:
        """The process ``pid`` if it still runs and is the one that started at ``started``."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        if start_time(pid) != started:  # checked after the pidfd pinned the process
            os.close(pidfd)
            return None
        return cls(pid, pidfd)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = -1
        if not self._exited.done():
            self._exited.set_result(-1)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def pidfd_getfd(self, fd: int) -> int | None:
        """A copy of the process's descriptor ``fd`` (``pidfd_getfd(2)``), or None when the kernel
        refuses (before Linux 5.6, or a ptrace policy forbidding it)."""
        libc = ctypes.CDLL(None, use_errno=True)
        copy = int(libc.syscall(_SYS_PIDFD_GETFD, self._pidfd, fd, 0))
        return copy if copy >= 0 else None


#: ``pidfd_getfd``'s number in the generic syscall table (the same on x86-64 and arm64).
_SYS_PIDFD_GETFD = 438


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` that a proxy process inherits: held by ``kubeserve
    start`` across proxy restarts, so connections wait in its backlog instead of being refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(4096)
    except BaseException:
        sock.close()
        raise
    return sock


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


_TLS_PROBE_REQUEST = b"GET /-/healthz HTTP/1.1\r\nHost: kubeserve\r\nConnection: close\r\n\r\n"


def tls_probe(host: str, port: int, client_certificates: bool) -> Callable[[], Awaitable[bool]]:
    """The readiness probe of a proxy serving HTTPS: ``GET /-/healthz`` answers 200 within 5 s.
    With ``client_certificates`` required, which this probe does not have, a completed TLS 1.3
    handshake is the answer (a proxy accepts only once it serves; the client's side of a 1.3
    handshake completes before the server looks at the client's certificate).

    The probe trusts any server certificate: it checks the proxy it started, not an identity.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_3

    async def answer() -> bool:
        reader, writer = await asyncio.open_connection(host, port, ssl=context)
        try:
            if client_certificates:
                return True
            writer.write(_TLS_PROBE_REQUEST)
            return (await reader.readline()).startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()

    async def probe() -> bool:
        try:
            return await asyncio.wait_for(answer(), 5.0)
        except (OSError, TimeoutError):
            return False

    return probe
