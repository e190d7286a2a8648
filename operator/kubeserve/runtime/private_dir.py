"""A directory only this user may enter, for the proxy's private unix sockets.

The proxy behind the native data path listens on unix sockets in such a directory (its HTTP and
gRPC fallbacks, the native process's control sockets): no other local process may reach them.
``tempfile.TemporaryDirectory`` would do, but ``tempfile`` imports ``shutil`` (with ``zlib``,
``bz2`` and ``lzma``) and ``random``'s name generator, ~0.7 MB of a proxy's resident memory for
one directory; the directory holds sockets only, so removing it needs no ``rmtree``.
"""

from __future__ import annotations

import contextlib
import os
import weakref

__all__ = ["PrivateDir"]


def _remove(path: str) -> None:
    """Remove ``path`` and the files (sockets) in it; what is already gone is no error."""
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


class PrivateDir:
    """A new directory (mode 0700) under ``$TMPDIR`` (else ``/tmp``) named ``prefix`` and random
    characters; :meth:`cleanup` (or the interpreter's exit) removes it with its files."""

    def __init__(self, prefix: str) -> None:
        parent = os.environ.get("TMPDIR") or "/tmp"
        while True:
            path = os.path.join(parent, prefix + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            break
        os.chmod(path, 0o700)  # (whatever the umask)
        #: the directory's path
        self.name = path
        self._finalizer = weakref.finalize(self, _remove, path)

    def cleanup(self) -> None:
        """Remove the directory and what it holds (again: nothing)."""
        self._finalizer()
