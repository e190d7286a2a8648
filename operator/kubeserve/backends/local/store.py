"""Desired state of the local backend, in one SQLite file (WAL mode).

The store is the only owner of accepted configuration: the controller re-reads it on every pass and
after a restart of ``kubeserve start``. Writes are single transactions, so a crash mid-apply leaves
either the old or the new desired state, never a mix.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeserve.backends.local.private_files import private_dir, private_file, tighten

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


class Store:
    """Synchronous on purpose: each call is a few rows in a local file, well under a millisecond."""

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        # Created 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's
        # mode, and both are tightened once more in case they predate this version.
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._migrate()
        for suffix in ("-wal", "-shm"):
            tighten(path.with_name(path.name + suffix))

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        """Bring a database written by an older kubeserve up to this schema."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(applications)")}
        with _transaction(self._db):
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
        with _transaction(self._db):
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
        with _transaction(self._db):
            self._db.execute("DELETE FROM applications")
            self._db.execute("DELETE FROM instance")


def _new_uid() -> str:
    return uuid.uuid4().hex


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class _transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
