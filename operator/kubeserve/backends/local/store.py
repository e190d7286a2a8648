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
    uid TEXT NOT NULL DEFAULT '',
    api_type TEXT NOT NULL DEFAULT 'declarative',
    graph BLOB
);
"""

#: :attr:`StoredApp.api_type` of an application deployed by a config (a PUT) and by
#: ``serve.run`` (Ray's ``APIType`` values).
DECLARATIVE, IMPERATIVE = "declarative", "imperative"


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
    #: :data:`DECLARATIVE` or :data:`IMPERATIVE`; an imperative application's pickled graph is
    #: read with :meth:`Store.graph` (its digest is in ``config``)
    api_type: str = DECLARATIVE


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
    """Synchronous on purpose: each call is a few rows in a local file, well under a millisecond.

    The only writer of its database (the state directory's lock keeps other instances out), so
    :meth:`load` answers from memory until this store writes: the controller's passes and every
    GET read the whole desired state, and decoding 1,000 configs each time held the event loop.
    """

    def __init__(self, path: Path) -> None:
        """Raises :class:`CorruptStateError` when ``path`` holds something SQLite cannot read."""
        self.path = path
        private_dir(path.parent)
        # Created 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's
        # mode, and both are tightened once more in case they predate this version.
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        #: what :meth:`load` read last; dropped by every write (see :meth:`_transaction`)
        self._loaded: tuple[DesiredState | None] | None = None
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
            if "api_type" not in columns:
                self._db.execute(
                    "ALTER TABLE applications ADD COLUMN api_type TEXT NOT NULL "
                    f"DEFAULT '{DECLARATIVE}'"
                )
                self._db.execute("ALTER TABLE applications ADD COLUMN graph BLOB")
            unnamed = self._db.execute("SELECT name FROM applications WHERE uid = ''").fetchall()
            for (name,) in unnamed:
                self._db.execute(
                    "UPDATE applications SET uid = ? WHERE name = ?", (_new_uid(), name)
                )

    def load(self) -> DesiredState | None:
        """The desired state; shared between callers until the next write, so never changed."""
        if self._loaded is None:
            self._loaded = (self._read(),)
        return self._loaded[0]

    def _read(self) -> DesiredState | None:
        row = self._db.execute("SELECT options, single_app, started_at FROM instance").fetchone()
        if row is None:
            return None
        apps = [
            StoredApp(name, json.loads(config), deployed_at, uid, api_type)
            for name, config, deployed_at, uid, api_type in self._db.execute(
                "SELECT name, config, deployed_at, uid, api_type FROM applications "
                "ORDER BY position"
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
        """Make these the declarative applications (Ray's ``apply_app_configs``): the
        imperative ones not listed stay (after them), unless ``single_app`` is given (the
        single-application PUT, whose application becomes the only one); a listed name that was
        imperative becomes declarative. ``deployed_at`` moves only for changed configs."""
        now = time.time()
        names = [app.get("name", "") for app in applications]
        with self._transaction():
            self._write_instance(options, single_app, now)
            old = {
                name: (config, uid, api_type)
                for name, config, uid, api_type in self._db.execute(
                    "SELECT name, config, uid, api_type FROM applications"
                )
            }
            placeholders = ",".join("?" * len(names))
            kept = "" if single_app is not None else f" AND api_type != '{IMPERATIVE}'"
            self._db.execute(
                f"DELETE FROM applications WHERE name NOT IN ({placeholders}){kept}", names
            )
            for position, (name, app) in enumerate(zip(names, applications, strict=True)):
                config = _dump(app)
                old_config, uid, old_type = old.get(name, (None, _new_uid(), DECLARATIVE))
                if old_config == config and old_type == DECLARATIVE:
                    self._db.execute(
                        "UPDATE applications SET position = ? WHERE name = ?", (position, name)
                    )
                    continue
                self._db.execute(
                    "INSERT OR REPLACE INTO applications "
                    "(name, config, deployed_at, position, uid) VALUES (?, ?, ?, ?, ?)",
                    (name, config, now, position, uid),
                )
            self._db.execute(
                f"UPDATE applications SET position = position + ? WHERE api_type = '{IMPERATIVE}'",
                (len(names),),
            )

    def put_imperative(self, options: dict[str, Any], config: dict[str, Any], graph: bytes) -> None:
        """Add or replace one application deployed with ``serve.run`` (the others stay);
        ``options`` start the serving layer when it is not running. The same config and graph
        again change nothing."""
        now = time.time()
        name = config["name"]
        with self._transaction():
            if self._db.execute("SELECT 1 FROM instance").fetchone() is None:
                self._write_instance(options, None, now)
            else:  # the single-application family's one application is no longer the only one
                self._db.execute("UPDATE instance SET single_app = NULL")
            row = self._db.execute(
                "SELECT config, uid, api_type, position FROM applications WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] == _dump(config) and row[2] == IMPERATIVE:
                return
            if row is None:
                (last,) = self._db.execute("SELECT MAX(position) FROM applications").fetchone()
                uid, position = _new_uid(), (-1 if last is None else last) + 1
            else:
                uid, position = row[1], row[3]
            self._db.execute(
                "INSERT OR REPLACE INTO applications "
                "(name, config, deployed_at, position, uid, api_type, graph) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (name, _dump(config), now, position, uid, IMPERATIVE, graph),
            )

    def delete_app(self, name: str) -> None:
        """Remove application ``name`` of either kind (a no-op when there is none)."""
        with self._transaction():
            self._db.execute("DELETE FROM applications WHERE name = ?", (name,))

    def graph(self, name: str) -> bytes | None:
        """The pickled graph of imperative application ``name`` (None: not imperative)."""
        row = self._db.execute("SELECT graph FROM applications WHERE name = ?", (name,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def _write_instance(
        self, options: dict[str, Any], single_app: dict[str, Any] | None, now: float
    ) -> None:
        previous = self._db.execute("SELECT started_at FROM instance").fetchone()
        started_at = previous[0] if previous else now
        self._db.execute(
            "INSERT OR REPLACE INTO instance (id, options, single_app, started_at) "
            "VALUES (1, ?, ?, ?)",
            (_dump(options), _dump(single_app) if single_app is not None else None, started_at),
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
        finally:
            self._loaded = None


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
