"""Zip archives served over HTTP, for runtime_env ``working_dir``/``py_modules`` URIs."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path


def write_zip(path: Path, files: Mapping[str, str | bytes | Path]) -> Path:
    """A zip archive at ``path`` of ``files`` (name in the archive -> text, bytes or a file)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            if isinstance(content, Path):
                archive.write(content, name)
            else:
                archive.writestr(name, content)
    return path


@contextlib.contextmanager
def serving(directory: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``directory``'s files over HTTP on ``host`` until the block ends; yields the base
    URL (``http://host:port/``)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass
