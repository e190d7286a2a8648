"""Desired state of the local backend, in one SQLite file (WAL mode).

The store is the only owner of accepted configuration: the controller re-reads it on every pass and
after a restart of ``kubeserve start``. Writes are single transactions, so a crash mid-apply leaves
either the old or the new desired state, never a mix; a write the disk refuses is rolled back and
raised as :class:`InsufficientStorageError` (the admin API's 507) or :class:`UnavailableError`.

A file that is not a readable database is never used or changed: :class:`CorruptStateError` names
it and the copy kept beside it, and :func:`move_aside` (``kubeserve start --reset-state``) lets a
new, empty one take its place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeserve.backends.local.private_files import private_dir, private_file, tighten
from kubeserve.backends.protocol import InsufficientStorageError, UnavailableError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS instance (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    options TEXT NOT NULL,
    single_app TEXT,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS applications (
    name TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    deployed_at REAL NOT NULL,
    position INTEGER NOT NULL,
    uid TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(frozen=True)
class StoredApp:
    name: str
    #: the application config exactly as the client set it (unset fields absent)
    config: dict[str, Any]
    #: when this config was last changed by a PUT (epoch seconds)
    deployed_at: float
    #: this incarnation of the name: new when the application is created (again, after a DELETE
    #: or a PUT that left it out), kept across config changes
    uid: str = ""


@dataclass(frozen=True)
class DesiredState:
    options: dict[str, Any]
    single_app: dict[str, Any] | None
    started_at: float
    applications: list[StoredApp]


class CorruptStateError(Exception):
    """The state database is not a readable SQLite database; it was left as it is."""


#: SQLite's result codes (the primary code, the low byte) for a disk that refused a write.
_SQLITE_IOERR, _SQLITE_FULL = 10, 13
#: ...and for a file that is not (or no longer) a database.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


class Store:
    """Synchronous on purpose: each call is a few rows in a local file, well under a millisecond."""

    def __init__(self, path: Path) -> None:
        """Raises :class:`CorruptStateError` when ``path`` holds something SQLite cannot read."""
        self.path = path
        private_dir(path.parent)
        # Created 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's
        # mode, and both are tightened once more in case they predate this version.
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            (check,) = self._db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            self._db.executescript(_SCHEMA)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if _code(exc) in (_SQLITE_IOERR, _SQLITE_FULL):
                raise _write_error(path, exc) from exc
            raise _corrupt(path, exc) from None
        for suffix in ("-wal", "-shm"):
            tighten(path.with_name(path.name + suffix))

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        """Bring a database written by an older kubeserve up to this schema."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(applications)")}
        with self._transaction():
            if "uid" not in columns:
                self._db.execute("ALTER TABLE applications ADD COLUMN uid TEXT NOT NULL DEFAULT ''")
            unnamed = self._db.execute("SELECT name FROM applications WHERE uid = ''").fetchall()
            for (name,) in unnamed:
                self._db.execute(
                    "UPDATE applications SET uid = ? WHERE name = ?", (_new_uid(), name)
                )

    def load(self) -> DesiredState | None:
        row = self._db.execute("SELECT options, single_app, started_at FROM instance").fetchone()
        if row is None:
            return None
        apps = [
            StoredApp(name, json.loads(config), deployed_at, uid)
            for name, config, deployed_at, uid in self._db.execute(
                "SELECT name, config, deployed_at, uid FROM applications ORDER BY position"
            )
        ]
        single = json.loads(row[1]) if row[1] is not None else None
        return DesiredState(json.loads(row[0]), single, row[2], apps)

    def replace(
        self,
        options: dict[str, Any],
        applications: list[dict[str, Any]],
        single_app: dict[str, Any] | None,
    ) -> None:
        """Make this the whole desired state; ``deployed_at`` moves only for changed configs."""
        now = time.time()
        names = [app.get("name", "") for app in applications]
        with self._transaction():
            previous = self._db.execute("SELECT started_at FROM instance").fetchone()
            started_at = previous[0] if previous else now
            self._db.execute(
                "INSERT OR REPLACE INTO instance (id, options, single_app, started_at) "
                "VALUES (1, ?, ?, ?)",
                (_dump(options), _dump(single_app) if single_app is not None else None, started_at),
            )
            old = {
                name: (config, uid)
                for name, config, uid in self._db.execute(
                    "SELECT name, config, uid FROM applications"
                )
            }
            placeholders = ",".join("?" * len(names))
            self._db.execute(f"DELETE FROM applications WHERE name NOT IN ({placeholders})", names)
            for position, (name, app) in enumerate(zip(names, applications, strict=True)):
                config = _dump(app)
                old_config, uid = old.get(name, (None, _new_uid()))
                if old_config == config:
                    self._db.execute(
                        "UPDATE applications SET position = ? WHERE name = ?", (position, name)
                    )
                    continue
                self._db.execute(
                    "INSERT OR REPLACE INTO applications "
                    "(name, config, deployed_at, position, uid) VALUES (?, ?, ?, ?, ?)",
                    (name, config, now, position, uid),
                )

    def clear(self) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM applications")
            self._db.execute("DELETE FROM instance")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction: committed whole, or rolled back whole (also when the commit
        itself fails, a full disk refusing the write-ahead log, say); a write the disk refused
        is raised as :class:`InsufficientStorageError` or :class:`UnavailableError`."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise _write_error(self.path, exc) from exc


def _code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def _write_error(path: Path, exc: sqlite3.Error) -> Exception:
    """What a refused write means to a client; other errors are kubeserve's own (a 500)."""
    code = _code(exc)
    if code == _SQLITE_FULL:
        os_error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return InsufficientStorageError(
            f"cannot store the config in {path} (the state directory {path.parent}): {os_error} "
            f"(SQLite: {exc}); nothing was changed, the config accepted before stays in force. "
            "Free space on that disk and send it again."
        )
    if code == _SQLITE_IOERR:
        return UnavailableError(
            f"cannot store the config in {path} (the state directory {path.parent}): the disk "
            f"failed the write (SQLite: {exc}); nothing was changed, the config accepted before "
            "stays in force"
        )
    return exc


def _corrupt(path: Path, exc: sqlite3.DatabaseError) -> CorruptStateError:
    """The error naming ``path`` and the copy of it kept aside (made here, once per content)."""
    try:
        copy = _keep_copy(path)
        kept = f"A copy of it is kept at {copy}."
    except OSError as copy_error:
        kept = f"No copy of it could be kept aside ({copy_error})."
    return CorruptStateError(
        f"the state database {path} is not a readable SQLite database ({exc}), so kubeserve "
        f"cannot tell which applications were deployed; it was left as it is. {kept} To start "
        "from an empty state (no applications; deploy them again), run kubeserve start with "
        "--reset-state, which moves the database aside and creates a new one."
    )


def _keep_copy(path: Path) -> Path:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    copy = path.with_name(f"{path.name}.corrupt-{digest.hexdigest()[:12]}")
    if not copy.exists():
        shutil.copyfile(path, copy)
        os.chmod(copy, 0o600)
    return copy


def move_aside(path: Path) -> Path | None:
    """Rename the database at ``path`` (and its -wal and -shm files) to ``<name>.reset-<time>``,
    so that the next :class:`Store` starts empty; returns the new name (None: there was none).

    A rename needs no free space: this works on a full disk too.
    """
    if not path.exists():
        return None
    aside = path.with_name(f"{path.name}.reset-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            os.replace(source, aside.with_name(aside.name + suffix))
    return aside


def _new_uid() -> str:
    return uuid.uuid4().hex


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
