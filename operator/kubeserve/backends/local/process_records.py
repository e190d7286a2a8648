"""Which replica and proxy processes run, kept in the state database for the next controller.

The data plane outlives ``kubeserve start``: a run killed outright leaves its replicas and proxy
serving, and the next run on the state directory adopts them instead of starting new ones. This
table is how it finds them. Invariants: a process has a record from the moment it was spawned (or
adopted) until it is asked to stop or is gone; a record names its process for good (PID *and*
start time, see :func:`processes.start_time`), so a reused PID is never taken for it.

Records are a hint, never the authority: a process is adopted only once it proves who it is
(a replica answers the authenticated channel's handshake under its replica id). Writing them is
best effort: a full disk refusing a record costs that process its adoption after a crash of
``kubeserve start`` (it is then killed as a leftover and replaced), never its start.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import astuple, dataclass, fields
from pathlib import Path

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS replica_processes (
    replica_id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    app_uid TEXT NOT NULL,
    deployment TEXT NOT NULL,
    version TEXT NOT NULL,
    user_config_version TEXT NOT NULL,
    port INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS proxy_process (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint TEXT NOT NULL,
    listen_fd INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class ReplicaRecord:
    replica_id: str
    app: str
    #: the application's incarnation (the store's uid): a replica of a deleted and re-created
    #: application is not the new one's
    app_uid: str
    deployment: str
    #: the replica's version (code, args, runtime_env) and the user_config it applied
    version: str
    user_config_version: str
    port: int
    pid: int
    start_time: int


@dataclass(frozen=True)
class ProxyRecord:
    #: what the proxy was started with (address and options), to compare with what is wanted
    fingerprint: str
    #: the descriptor of its listening socket in the proxy (inherited from ``kubeserve start``)
    listen_fd: int
    pid: int
    start_time: int


class ProcessRecords:
    """The two tables, on a connection of their own to the state database."""

    def __init__(self, database: Path) -> None:
        self._db = sqlite3.connect(database, isolation_level=None, timeout=5.0)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def replicas(self) -> list[ReplicaRecord]:
        names = ", ".join(f.name for f in fields(ReplicaRecord))
        rows = self._db.execute(f"SELECT {names} FROM replica_processes").fetchall()
        return [ReplicaRecord(*row) for row in rows]

    def proxy(self) -> ProxyRecord | None:
        names = ", ".join(f.name for f in fields(ProxyRecord))
        row = self._db.execute(f"SELECT {names} FROM proxy_process").fetchone()
        return None if row is None else ProxyRecord(*row)

    def put_replica(self, record: ReplicaRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO replica_processes VALUES (?,?,?,?,?,?,?,?,?)", astuple(record)
        )

    def applied_user_config(self, replica_id: str, version: str) -> None:
        self._write(
            "UPDATE replica_processes SET user_config_version = ? WHERE replica_id = ?",
            (version, replica_id),
        )

    def remove_replica(self, replica_id: str) -> None:
        self._write("DELETE FROM replica_processes WHERE replica_id = ?", (replica_id,))

    def put_proxy(self, record: ProxyRecord) -> None:
        self._write("INSERT OR REPLACE INTO proxy_process VALUES (1,?,?,?,?)", astuple(record))

    def remove_proxy(self) -> None:
        self._write("DELETE FROM proxy_process", ())

    def _write(self, sql: str, params: tuple[object, ...]) -> None:
        try:
            self._db.execute(sql, params)
        except sqlite3.Error as exc:
            log.warning("could not record a process in the state database: %s", exc)
