"""Files of ``kubeserve start`` that only its own user may read.

The state directory holds the accepted configuration (``user_config`` may carry credentials), the
replicas' start-up files and every process log. Invariant: the directory is mode 0700 (tightened
when it already existed with looser bits) and every file kubeserve creates in it is 0600 from the
moment it exists: modes are given to ``open(2)`` and re-applied with ``fchmod``, so neither the
umask nor an older, looser file leaves a window.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make ``path`` itself 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> None:
    """Create ``path`` empty if missing, and make it 0600 either way."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def open_private_log(path: Path) -> int:
    """An append-only descriptor on a 0600 log file (the caller closes it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def tighten(path: Path) -> None:
    """Make an existing file 0600 (files another library created, like SQLite's -wal and -shm)."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, FILE_MODE)
