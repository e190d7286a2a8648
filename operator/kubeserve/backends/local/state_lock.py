"""One ``kubeserve start`` per state directory.

Two instances on one directory would share a database and, worse, each would take the other's
processes for leftovers of a crashed run and kill them (see ``processes.kill_orphans``). The first
instance holds an exclusive ``flock`` on ``<state dir>/kubeserve.lock`` for its whole life (the
kernel drops it when the process ends, however it ends); a second one is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from kubeserve.backends.local.private_files import FILE_MODE, private_dir


class StateDirInUse(Exception):
    """Another live ``kubeserve start`` owns the state directory."""


class StateDirLock:
    def __init__(self, state_dir: Path) -> None:
        private_dir(state_dir)
        self.path = state_dir / "kubeserve.lock"
        # not inherited by children (Python's default), so only this process ever holds it
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise StateDirInUse(
                f"another kubeserve start (pid {owner}) is using the state directory {state_dir}; "
                "stop it first, or pass another --state-dir"
            ) from None
        os.fchmod(self._fd, FILE_MODE)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
