"""The local store: incarnations of application names, file modes, migration of older files."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from kubeserve.backends.local.store import Store

HELLO = {"name": "hello", "import_path": "examples.hello:app"}


def _uid(store: Store, name: str) -> str:
    state = store.load()
    assert state is not None
    return next(app.uid for app in state.applications if app.name == name)


def test_an_application_keeps_its_uid_across_changes(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.replace({}, [HELLO], None)
    first = _uid(store, "hello")
    store.replace({}, [{**HELLO, "route_prefix": "/x"}], None)
    assert _uid(store, "hello") == first


def test_an_application_created_again_is_a_new_incarnation(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.replace({}, [HELLO], None)
    first = _uid(store, "hello")
    store.clear()
    store.replace({}, [HELLO], None)
    second = _uid(store, "hello")
    store.replace({}, [], None)
    store.replace({}, [HELLO], None)
    assert len({first, second, _uid(store, "hello")}) == 3


def test_the_database_and_its_directory_are_private(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = Store(state_dir / "kubeserve.db")
    store.replace({}, [HELLO], None)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    for name in ("kubeserve.db", "kubeserve.db-wal", "kubeserve.db-shm"):
        assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600, name


def test_a_database_of_an_older_version_gets_uids(tmp_path: Path) -> None:
    path = tmp_path / "kubeserve.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE applications (name TEXT PRIMARY KEY, config TEXT NOT NULL,"
        " deployed_at REAL NOT NULL, position INTEGER NOT NULL);"
        "CREATE TABLE instance (id INTEGER PRIMARY KEY CHECK (id = 1), options TEXT NOT NULL,"
        " single_app TEXT, started_at REAL NOT NULL);"
        "INSERT INTO instance VALUES (1, '{}', NULL, 1.0);"
        "INSERT INTO applications VALUES ('hello', '{\"name\": \"hello\"}', 1.0, 0);"
    )
    old.commit()
    old.close()
    assert _uid(Store(path), "hello")
