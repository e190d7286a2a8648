"""A child process of kubeserve that must not outlive the process that started it.

``PR_SET_PDEATHSIG`` asks the kernel to SIGKILL this process when its parent exits. Set from the
child itself (:func:`die_with`), the child needs no code run between ``fork`` and ``exec``, so
the parent can start it with ``vfork`` and is not held up while the child is scheduled: what
keeps a busy ``kubeserve start``'s event loop answering while it starts build after build.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["die_with", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (best effort: not Linux, nothing happens)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with(parent_pid: int) -> None:
    """:func:`die_with_parent`, and exit at once if the parent ``parent_pid`` is gone already
    (it died before this process asked: the kernel's signal would never come)."""
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)
