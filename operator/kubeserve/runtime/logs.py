"""Log records of replicas and proxies as Ray Serve writes them: context, encodings, access lines.

A Ray Serve user's log pipeline reads lines such as

    INFO 2026-11-24 10:00:00,123 Echo Echo-1-ab12cd 5f0c... -- GET /echo 200 1.2ms

(level, time, component name and id, the request id while a request is served, ``--`` and the
message) or, with ``logging_config.encoding: JSON``, one object per line with Ray's keys
(``asctime``, ``levelname``, ``message``, ``filename``, ``lineno``, ``application``,
``deployment``, ``replica``, ``component_name``, ``request_id``, ``route`` and the
``additional_log_standard_attrs``). :func:`configure` installs that on a process's root logger,
so the user's own ``logging`` records (the ``ray.serve`` logger's and any other) carry the request
id of the request they were written for (:data:`kubeserve.sdk.context.request_context`).

Access lines (``GET /echo 200 1.2ms``, Ray's ``access_log_msg``) are written per request by the
proxy and by replicas unless ``logging_config.enable_access_log`` is false.

Log files are rotated by size (:class:`RotatingOutput`): the process's stdout and stderr follow
the current file, so ``print`` and tracebacks rotate with the records.

Access lines may have a file of their own (:data:`ACCESS_LOG_FILE_ENV`, rotated with the same
limits): pods on Kubernetes write them there by default (``ServeInstance.spec.logs.accessLines``),
so the container's output, which the runtime copies line by line into the kubelet's log, keeps the
records (a traceback is not rotated away by a few seconds of traffic) and the node does not spend
the runtime's CPU on every request's line.

A log never stops a process from serving (:class:`DroppingFile`): a write the disk refuses
(``ENOSPC``, ``EDQUOT``, ``EIO``...) is dropped and counted, never raised into a request, a
``print`` or a rollover; a log file that cannot be opened drops every line until it can. The count
is :func:`dropped_lines` (the ``kubeserve_log_lines_dropped_total`` metric) and a warning says so
on stderr at most once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

from kubeserve.sdk import context

__all__ = [
    "ACCESS_FLUSH_S",
    "ACCESS_LOGGER",
    "ACCESS_LOG_FILE_ENV",
    "ACCESS_RECORD",
    "DEFAULT_LOG_BACKUPS",
    "DEFAULT_LOG_BYTES",
    "LOG_BACKUPS_ENV",
    "LOG_BYTES_ENV",
    "LOG_FILE_ENV",
    "AccessLog",
    "ComponentLog",
    "DroppingFile",
    "LogSettings",
    "RotatingLog",
    "RotatingOutput",
    "access_message",
    "active",
    "configure",
    "dropped_lines",
    "output_from_environment",
    "record_dropped",
]

#: The logger of access lines (Ray's ``ray.serve`` logger, as Ray writes them).
ACCESS_LOGGER = "ray.serve"
#: Where a process of ``kubeserve start`` writes its log (rotated), and the rotation's limits:
#: bytes per file and rotated files kept. Unset (Kubernetes): records go to stderr.
LOG_FILE_ENV = "KUBESERVE_LOG_FILE"
#: Where access lines go instead, when set (rotated like :data:`LOG_FILE_ENV`'s file).
ACCESS_LOG_FILE_ENV = "KUBESERVE_ACCESS_LOG_FILE"
LOG_BYTES_ENV = "KUBESERVE_LOG_MAX_BYTES"
LOG_BACKUPS_ENV = "KUBESERVE_LOG_BACKUPS"
DEFAULT_LOG_BYTES = 16 * 1024 * 1024
DEFAULT_LOG_BACKUPS = 4

#: Attributes every record has; ``additional_log_standard_attrs`` may name some of them.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def access_message(method: str, route: str, status: int | str, latency_ms: float) -> str:
    """Ray's access line: ``GET /route 200 1.2ms``."""
    return f"{method} {route} {status} {latency_ms:.1f}ms"


class LogSettings:
    """Ray's ``logging_config`` as a process applies it (defaults: Ray's)."""

    __slots__ = ("access_log", "additional_attrs", "encoding", "level")

    def __init__(self, logging_config: Mapping[str, Any] | None = None) -> None:
        given = dict(logging_config or {})
        self.encoding = str(given.get("encoding") or "TEXT").upper()
        self.level = str(given.get("log_level") or "INFO").upper()
        self.access_log = bool(given.get("enable_access_log", True))
        self.additional_attrs = [
            str(a) for a in given.get("additional_log_standard_attrs") or [] if str(a) in _STANDARD
        ]


class ComponentLog(logging.Filter):
    """Adds the component's and the current request's fields to every record (filters nothing).

    ``component_name``/``component_id`` are Ray's: the deployment and the replica id for a
    replica, ``proxy`` and the node for a proxy.
    """

    def __init__(
        self,
        component_type: str,
        component_name: str,
        component_id: str,
        application: str = "",
        deployment: str = "",
    ) -> None:
        super().__init__()
        self.component_type = component_type
        self.component_name = component_name
        self.component_id = component_id
        self.application = application
        self.deployment = deployment

    def filter(self, record: logging.LogRecord) -> bool:
        record.component_name = self.component_name
        record.component_id = self.component_id
        record.component_type = self.component_type
        if self.deployment:
            record.application = self.application
            record.deployment = self.deployment
            record.replica = self.component_id
        current = context.request_context.get()
        if current is not None:
            if current.request_id and not hasattr(record, "request_id"):
                record.request_id = current.request_id
            if current.route and not hasattr(record, "route"):
                record.route = current.route
        return True


class _TextFormatter(logging.Formatter):
    """``LEVEL TIME NAME ID [REQUEST_ID] [attrs] -- MESSAGE``, as Ray's ``ServeFormatter``."""

    def __init__(self, additional: list[str]) -> None:
        super().__init__()
        self._additional = additional

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        parts = [
            record.levelname,
            self.formatTime(record),
            str(getattr(record, "component_name", "")),
            str(getattr(record, "component_id", "")),
        ]
        request_id = getattr(record, "request_id", "")
        if request_id:
            parts.append(str(request_id))
        parts += [str(getattr(record, a, "")) for a in self._additional]
        text = " ".join(parts) + " -- " + record.message
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text += "\n" + record.exc_text
        return text


#: The record attributes a JSON line carries when set, besides the message and its origin.
_CONTEXT_KEYS = (
    "application",
    "deployment",
    "replica",
    "component_name",
    "component_id",
    "component_type",
    "request_id",
    "route",
)


class _JsonFormatter(logging.Formatter):
    """One JSON object per record with Ray's keys (``encoding: JSON``)."""

    def __init__(self, additional: list[str]) -> None:
        super().__init__()
        self._additional = additional

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "message": record.getMessage(),
            "filename": record.filename,
            "lineno": record.lineno,
        }
        for key in _CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value:
                line[key] = value
        for key in self._additional:
            line[key] = getattr(record, key, None)
        if record.exc_info:
            line["exc_text"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


#: How often, at most, a process warns on stderr that it drops log lines.
DROP_WARNING_INTERVAL_S = 60.0


class _Drops:
    """This process's count of log lines it could not write, and when it last said so."""

    def __init__(self) -> None:
        self.total = 0
        self.since_warning = 0
        self.warned_at = -DROP_WARNING_INTERVAL_S
        #: called with each count dropped (the metric: :func:`kubeserve.runtime.metrics`)
        self.listeners: list[Callable[[int], None]] = []


_drops = _Drops()


def dropped_lines() -> int:
    """Log lines this process has dropped since it started."""
    return _drops.total


def on_dropped(listener: Callable[[int], None]) -> None:
    """Call ``listener(lines)`` for every count of lines dropped from now on."""
    _drops.listeners.append(listener)


def record_dropped(path: str, error: OSError, lines: int = 1) -> None:
    """Count ``lines`` that could not be written to ``path``; warn on stderr at most once a minute.

    The warning goes straight to file descriptor 2, never through ``sys.stderr`` (which may be a
    :class:`DroppingFile` on the very disk that is full), and a failure to write it is ignored.
    """
    _drops.total += lines
    _drops.since_warning += lines
    for listener in _drops.listeners:
        listener(lines)
    now = time.monotonic()
    if now - _drops.warned_at < DROP_WARNING_INTERVAL_S:
        return
    warning = (
        f"kubeserve: dropped {_drops.since_warning} log lines (total {_drops.total}): cannot "
        f"write {path}: {error}; the process goes on serving\n"
    )
    _drops.warned_at, _drops.since_warning = now, 0
    with contextlib.suppress(OSError):
        os.write(2, warning.encode(errors="replace"))


class DroppingFile(io.RawIOBase):
    """An append-only log file (mode 0600) whose writes never raise.

    A write the disk refuses is dropped and counted (:func:`record_dropped`); a partial write's
    remainder likewise. A file that cannot be opened (a full disk refusing a new file, say) drops
    everything until a later write, at most once a second, finds it can open it. ``fd``: write to
    this open descriptor instead (stdout or stderr), which is not closed.
    """

    _REOPEN_S = 1.0

    def __init__(self, path: str, fd: int | None = None) -> None:
        super().__init__()
        self.path = path
        self._owned = fd is None
        self._fd = fd
        self._tried_at = 0.0
        if fd is None:
            self._open()

    def _open(self) -> None:
        self._tried_at = time.monotonic()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            record_dropped(self.path, exc, 0)
            return
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)
        self._fd = fd

    @property
    def opened(self) -> bool:
        return self._fd is not None

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self._fd is None:
            raise OSError(f"{self.path} is not open")
        return self._fd

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if self._fd is None:
            return 0
        try:
            return os.lseek(self._fd, offset, whence)
        except OSError:
            return 0

    def write(self, data: Any) -> int:
        """Write all of ``data`` or drop what is left; always answers ``len(data)``."""
        view = memoryview(data).cast("B")
        size = len(view)
        if self._fd is None and self._owned and time.monotonic() - self._tried_at >= self._REOPEN_S:
            self._open()
        if self._fd is None:
            _drop(self.path, view, OSError(f"{self.path} could not be opened"))
            return size
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            _drop(self.path, view, exc)
        return size

    def close(self) -> None:
        if self._fd is not None and self._owned and not self.closed:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        super().close()


def _drop(path: str, data: Any, error: OSError) -> None:
    record_dropped(path, error, bytes(data).count(b"\n") or 1)


def _text(raw: DroppingFile) -> io.TextIOWrapper:
    """Text written straight through: one ``write(2)`` per record, batch or ``print``."""
    return io.TextIOWrapper(
        raw,  # type: ignore[arg-type]
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )


class RotatingLog(logging.StreamHandler):  # type: ignore[type-arg]
    """A size-rotated log file that never raises: its stream is a :class:`DroppingFile`, and a
    rollover the disk refuses (a rename, the new file) leaves it writing where it can.

    It rotates as ``logging.handlers.RotatingFileHandler`` does (``path.1`` ... ``path.N``, the
    oldest removed; a record that would take the file to ``max_bytes`` starts a new one; a
    ``path`` that is no regular file, such as ``/dev/null``, never rotates; 0: never), without
    importing ``logging.handlers``: it imports ``pickle``, ``queue`` and ``socket``'s handlers,
    ~0.5 MB of every proxy and replica that writes a log file.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.baseFilename = os.path.abspath(path)
        # (the names of ``RotatingFileHandler``'s: :meth:`AccessLog.flush` reads either)
        self.maxBytes, self.backupCount = max_bytes, backups
        super().__init__(self._open())

    def _open(self) -> io.TextIOWrapper:
        return _text(DroppingFile(self.baseFilename))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.stream is None:  # closed, then written to (a record at exit)
                self.stream = self._open()
            if self._full(record):
                self.doRollover()
        except Exception:
            self.handleError(record)
            return
        super().emit(record)

    def _full(self, record: logging.LogRecord) -> bool:
        if self.maxBytes <= 0:
            return False
        if os.path.exists(self.baseFilename) and not os.path.isfile(self.baseFilename):
            return False
        line = f"{self.format(record)}\n"
        self.stream.seek(0, os.SEEK_END)
        return bool(self.stream.tell() + len(line) >= self.maxBytes)

    def doRollover(self) -> None:
        """``path.N-1`` becomes ``path.N`` ... ``path`` becomes ``path.1``; a new ``path``."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            stream.close()
        try:
            if self.backupCount > 0:
                for i in range(self.backupCount - 1, 0, -1):
                    older, newer = f"{self.baseFilename}.{i}", f"{self.baseFilename}.{i + 1}"
                    if os.path.exists(older):
                        if os.path.exists(newer):
                            os.remove(newer)
                        os.rename(older, newer)
                first = f"{self.baseFilename}.1"
                if os.path.exists(first):
                    os.remove(first)
                if os.path.exists(self.baseFilename):
                    os.rename(self.baseFilename, first)
        except OSError as exc:
            record_dropped(self.baseFilename, exc, 0)
        self.stream = self._open()

    def close(self) -> None:
        with self.lock or contextlib.nullcontext():
            try:
                if self.stream is not None:
                    try:
                        self.flush()
                    finally:
                        stream, self.stream = self.stream, None
                        stream.close()
            finally:
                super().close()

    def handleError(self, record: logging.LogRecord) -> None:
        """A record that could not be formatted or written: counted, never a traceback."""
        exc = sys.exc_info()[1]
        record_dropped(self.baseFilename, exc if isinstance(exc, OSError) else OSError(str(exc)), 1)


class RotatingOutput(RotatingLog):
    """A :class:`RotatingLog` that the process's stdout and stderr also write to.

    After each rollover file descriptors 1 and 2 are pointed at the new file, so what the
    process prints (and a traceback it dies with) lands in the current file too; ``sys.stdout``
    and ``sys.stderr`` drop what the disk refuses instead of raising into a ``print``.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        super().__init__(path, max_bytes, backups)
        self._follow()
        sys.stdout = _text(DroppingFile(path, 1))
        sys.stderr = _text(DroppingFile(path, 2))

    def doRollover(self) -> None:
        super().doRollover()
        self._follow()

    def _follow(self) -> None:
        if self.stream is None:
            self.stream = self._open()
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        with contextlib.suppress(OSError):
            sys.stderr.flush()
        raw = getattr(self.stream, "buffer", None)
        if isinstance(raw, DroppingFile) and raw.opened:
            fd = raw.fileno()
            os.dup2(fd, 1)
            os.dup2(fd, 2)


_active: LogSettings = LogSettings()
_output: logging.Handler | None = None
_batched: AccessLog | None = None
#: :data:`ACCESS_LOG_FILE_ENV`'s file, opened by the first :func:`configure` (None: unset)
_access_output: logging.Handler | None = None
#: what ``logging``'s records marked :data:`ACCESS_RECORD` carry
ACCESS_RECORD = "serve_access_log"


def active() -> LogSettings:
    """The settings :func:`configure` installed last (Ray's defaults before)."""
    return _active


def output_from_environment() -> logging.Handler | None:
    """The rotated log file :data:`LOG_FILE_ENV` names, or None (write to stderr)."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return None
    return RotatingOutput(path, *_rotation())  # never raises: see DroppingFile


def _rotation() -> tuple[int, int]:
    """Bytes per log file and rotated files kept, from the environment."""
    max_bytes = int(os.environ.get(LOG_BYTES_ENV) or DEFAULT_LOG_BYTES)
    backups = int(os.environ.get(LOG_BACKUPS_ENV) or DEFAULT_LOG_BACKUPS)
    return max_bytes, backups


def _access_file() -> logging.Handler | None:
    """The rotated file of access lines :data:`ACCESS_LOG_FILE_ENV` names (opened once), or None."""
    global _access_output
    path = os.environ.get(ACCESS_LOG_FILE_ENV)
    if _access_output is None and path:
        _access_output = RotatingLog(path, *_rotation())  # never raises: see DroppingFile
    return _access_output


class _AccessRecords(logging.Filter):
    """Passes the access records (:data:`ACCESS_RECORD`) only (``wanted``) or all but them."""

    def __init__(self, wanted: bool) -> None:
        super().__init__()
        self.wanted = wanted

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, ACCESS_RECORD, False)) is self.wanted


def configure(
    settings: LogSettings, component: ComponentLog, output: logging.Handler | None = None
) -> None:
    """Install ``settings`` on this process's root logger: one handler (``output``; else the
    one installed before; else stderr), the component's fields, the encoding and the level;
    access records go to :data:`ACCESS_LOG_FILE_ENV`'s file instead when it is set."""
    global _active, _output, _batched
    handler = output or _output or logging.StreamHandler(_stderr())
    if _batched is not None:
        _batched.flush()  # lines of the settings before go out in their format
    _active, _output = settings, handler
    access_file = _access_file()
    handlers = [handler] if access_file is None else [handler, access_file]
    for one in handlers:
        for old in list(one.filters):
            one.removeFilter(old)
        one.addFilter(component)
        if access_file is not None:
            one.addFilter(_AccessRecords(one is access_file))
        one.setFormatter(
            _JsonFormatter(settings.additional_attrs)
            if settings.encoding == "JSON"
            else _TextFormatter(settings.additional_attrs)
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for one in handlers:
        root.addHandler(one)
    root.setLevel(settings.level)
    access = logging.getLogger(ACCESS_LOGGER)
    access.setLevel(settings.level)
    enabled = settings.access_log and access.isEnabledFor(logging.INFO)
    _batched = (
        AccessLog(component, settings.encoding)
        if enabled and not settings.additional_attrs
        else None
    )


def batched_access() -> AccessLog | None:
    """Where this process writes its access lines in batches, as :func:`configure` set it up;
    ``None`` when they are off (``enable_access_log``, the level) or must be records (an
    ``additional_log_standard_attrs`` that only a record has)."""
    return _batched


def _stderr() -> TextIO:
    return sys.stderr


#: An access line waiting to be written: time, method, route, status, latency (ms), request id
#: and the JSON line's route.
_Entry = tuple[float, str, str, int | str, float, bytes | str | None, str]

#: Most access lines a replica's tally holds between two flushes (``kubeserve._native``'s
#: ``MAX_ACCESS_LINES``, the native data path's limit too): past it they are counted and dropped.
MAX_ACCESS_LINES = 200_000


class LineFormat:
    """How access lines are written: TEXT or JSON lines (``json``), ``component`` the
    component's part of each line in its final form (TEXT: `` <component name> <component id>
    ``; JSON: its fields as ``json.dumps`` of the record writes them, ``"filename": ...`` to
    ``"component_type": ...``). The native formatter (``native/src/access.rs``, the proxy's data
    path and a replica's compiled tally) is given the same two (:meth:`AccessLog.native_format`)
    and writes the same bytes."""

    __slots__ = ("_second", "_stamp", "component", "json")

    def __init__(self, json: bool, component: str) -> None:
        self.json = json
        self.component = component
        self._second = -1
        self._stamp = ""

    def lines(self, entries: list[_Entry]) -> list[str]:
        """The lines of ``entries``, each ending in a newline."""
        if self.json:
            return [self._json_line(entry) for entry in entries]
        return text_lines(entries, self._second_stamp, self.component)

    def _asctime(self, at: float) -> str:
        second = int(at)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int((at - second) * 1000):03d}"

    def _second_stamp(self, second: int) -> str:
        """``INFO <asctime without its milliseconds>`` of a TEXT line in ``second``."""
        return "INFO " + self._asctime(second)[:-4]

    def _json_line(self, entry: _Entry) -> str:
        """One JSON line: the fields of its record, in the order and spelling ``json.dumps``
        of the record writes them."""
        at, method, route, status, latency_ms, request_id, route_field = entry
        rid = request_id.decode("latin-1") if isinstance(request_id, bytes) else request_id or ""
        message = json.dumps(access_message(method, route, status, latency_ms))
        line = (
            f'{{"asctime": "{self._asctime(at)}", "levelname": "INFO", "message": {message}, '
            + self.component
        )
        if rid:
            line += ', "request_id": ' + json.dumps(rid)
        if route_field:
            line += ', "route": ' + json.dumps(route_field)
        return line + "}\n"


class TallyLines(Protocol):
    """Access lines held elsewhere (a replica's tally, :mod:`kubeserve.runtime.replica.tally`),
    already formatted, taken by :meth:`AccessLog.write_tally`."""

    def lines(self) -> int: ...

    def take_lines(self) -> tuple[bytes | str, int]: ...


#: How long access lines wait in memory before they are written together.
ACCESS_FLUSH_S = 0.1


class AccessLog:
    """Access lines of a proxy or a replica, formatted by hand and written together every
    :data:`ACCESS_FLUSH_S` (no log record per request: both are on every request's path, and a
    record, its filter, its formatter and its handler's flush and rollover checks cost a replica
    about a fifth of its time on a small request).

    The lines are those :func:`configure`'s formatters would write for a record of the
    ``ray.serve`` logger with the component's and the request's fields, so one log holds one
    format; they go to the handler :func:`configure` installed (rotated with it), or to
    :data:`ACCESS_LOG_FILE_ENV`'s file when it is set. A replica whose
    ``additional_log_standard_attrs`` asks for record attributes logs records instead
    (:func:`batched_access`).

    The native formatter writes these lines in this format (:meth:`native_format`) and hands
    them over as one block: the native data path's as text (:meth:`write_lines`), a replica's
    compiled tally's as bytes (:meth:`write_tally`), written as they are. One writer of the log
    file stays.
    """

    def __init__(self, component: ComponentLog, encoding: str) -> None:
        fields: dict[str, Any] = {"filename": component.component_type, "lineno": 0}
        if component.deployment:
            fields["application"] = component.application
            fields["deployment"] = component.deployment
            fields["replica"] = component.component_id
        fields["component_name"] = component.component_name
        fields["component_id"] = component.component_id
        fields["component_type"] = component.component_type
        if encoding == "JSON":
            self._format = LineFormat(True, json.dumps(fields)[1:-1])
        else:
            self._format = LineFormat(
                False, f" {component.component_name} {component.component_id} "
            )
        self._pending: list[_Entry] = []
        self._formatted: list[bytes | str] = []
        self._scheduled = False

    def add(
        self,
        method: str,
        route: str,
        status: int | str,
        latency_ms: float,
        request_id: bytes | str | None,
        route_field: str | None = None,
        at: float | None = None,
    ) -> None:
        """One line: ``METHOD ROUTE STATUS LATENCYms``; ``route_field`` is the JSON line's
        ``route`` when it is not ``route`` (a replica's handle call names its method in the
        message and the request's route there); ``at``: when it was answered, if not now."""
        field = route if route_field is None else route_field
        when = time.time() if at is None else at
        self._pending.append((when, method, route, status, latency_ms, request_id, field))
        if not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_later(ACCESS_FLUSH_S, self.flush)
            except RuntimeError:  # no event loop: at once
                self.flush()

    def native_format(self) -> dict[str, Any]:
        """What the native formatter (``native/src/access.rs``) formats these lines with: the
        encoding and the component's part of each line, in its final form (:class:`LineFormat`)."""
        return {"json": self._format.json, "component": self._format.component}

    def write_lines(self, text: str) -> None:
        """Write access lines formatted elsewhere in this format (the native data path's, each
        ending in a newline), with those waiting here, now."""
        if text:
            self._formatted.append(text)
            self.flush()

    def write_tally(self, tally: TallyLines) -> None:
        """Write the lines a replica's tally holds (:mod:`kubeserve.runtime.replica.tally`,
        formatted there in :meth:`native_format`'s format: the same lines :meth:`add` would
        have given), with those waiting here: one block, rolled over between lines only when
        the file must roll over."""
        if not tally.lines():
            return
        block, dropped = tally.take_lines()
        if dropped:
            path = str(getattr(_access_output or _output, "baseFilename", "") or "<stderr>")
            error = OSError(f"over {MAX_ACCESS_LINES} access lines in {ACCESS_FLUSH_S} s")
            record_dropped(path, error, dropped)
        self._formatted.append(block)
        self.flush()

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        chunks, self._formatted = self._formatted, []
        if pending:
            chunks.extend(self._format.lines(pending))
        if not chunks:
            return
        handler = _access_output or _output
        stream = getattr(handler, "stream", None)
        if handler is None or stream is None:
            _writer(sys.stderr)(_encoded(chunks))
            return
        handler.acquire()
        try:
            _write_rotating(handler, stream, chunks)
        finally:
            handler.release()


def text_lines(entries: list[_Entry], stamp: Callable[[int], str], who: str) -> list[str]:
    """TEXT access lines, ``INFO <asctime> <component name> <id> [<request id>] -- <message>``
    (``who`` is `` <component name> <id> ``; ``stamp(second)`` gives ``INFO <asctime without
    its milliseconds>``): one ``%`` each, the time stamp's second formatted once per second (what
    a flush of a loaded process formats is mostly this: it once cost a third of the proxy's time
    spent on access lines). The Python proxy's lines and a replica's pure Python tally's
    (:mod:`kubeserve.runtime.replica.tally`) both come from here."""
    who = who.replace("%", "%%")
    with_id = "%s,%03d" + who + "%s -- %s %s %s %.1fms\n"
    without_id = "%s,%03d" + who + "-- %s %s %s %.1fms\n"
    lines: list[str] = []
    append = lines.append
    second, stamped = -1, ""
    for at, method, route, status, latency_ms, request_id, _ in entries:
        whole = int(at)
        if whole != second:
            second, stamped = whole, stamp(whole)
        millis = int((at - whole) * 1000)
        if request_id:
            if request_id.__class__ is bytes:
                request_id = request_id.decode("latin-1")
            append(with_id % (stamped, millis, request_id, method, route, status, latency_ms))
        else:
            append(without_id % (stamped, millis, method, route, status, latency_ms))
    return lines


def _writer(stream: Any) -> Callable[[bytes], None]:
    """Writes UTF-8 lines to the text ``stream`` of a log, flushed: straight to the binary file
    under it when it writes UTF-8 (a replica's tallied block then never becomes Python text),
    after what was written to it as text."""
    raw = getattr(stream, "buffer", None)
    encoding = str(getattr(stream, "encoding", "") or "").lower().replace("_", "-")
    if raw is not None and encoding in ("utf-8", "utf8"):
        stream.flush()

        def write_bytes(data: bytes) -> None:
            raw.write(data)
            raw.flush()

        return write_bytes

    def write_text(data: bytes) -> None:
        stream.write(data.decode(errors="backslashreplace"))
        stream.flush()

    return write_text


def _encoded(chunks: list[bytes | str]) -> bytes:
    """``chunks`` as one UTF-8 block (a single ``bytes`` chunk: itself, not a copy)."""
    return b"".join(
        c if isinstance(c, bytes) else c.encode(errors="backslashreplace") for c in chunks
    )


def _write_rotating(handler: logging.Handler, stream: Any, chunks: list[bytes | str]) -> None:
    """Write ``chunks`` (each one or more whole lines) to ``handler``'s ``stream`` in one write,
    unless its file would grow past its ``maxBytes``: then it rolls over between lines, as
    records would (a :class:`RotatingLog`, or logging.handlers' RotatingFileHandler, which is
    not imported for this)."""
    write, block = _writer(stream), _encoded(chunks)
    limit = getattr(handler, "maxBytes", 0)
    if not limit or not hasattr(handler, "doRollover") or stream.tell() + len(block) < limit:
        write(block)  # the common case: the whole block fits
        return
    rotating: Any = handler
    size = stream.tell()
    start = at = 0  # the first line not written yet; the next line
    while at < len(block):
        newline = block.find(b"\n", at)  # (not splitlines: a route may hold a U+2028)
        end = len(block) if newline < 0 else newline + 1
        if size and size + (end - at) >= limit:
            if at > start:
                write(block[start:at])
            rotating.doRollover()
            write = _writer(rotating.stream)
            size, start = 0, at
        size += end - at
        at = end
    if at > start:
        write(block[start:at])
