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


IMPERATIVE_APP = {"name": "driven", "route_prefix": "/driven", "pickled_graph_sha256": "ab"}


def _kinds(store: Store) -> dict[str, str]:
    state = store.load()
    assert state is not None
    return {app.name: app.api_type for app in state.applications}


def test_a_config_keeps_imperative_applications_it_does_not_list(tmp_path: Path) -> None:
    """Ray 2.60's apply_app_configs: only the declarative applications left out go."""
    store = Store(tmp_path / "kubeserve.db")
    store.replace({}, [HELLO, {**HELLO, "name": "other"}], None)
    store.put_imperative({}, IMPERATIVE_APP, b"graph")
    store.replace({}, [HELLO], None)
    assert _kinds(store) == {"hello": "declarative", "driven": "imperative"}
    assert store.graph("driven") == b"graph" and store.graph("hello") is None


def test_a_config_naming_an_imperative_application_makes_it_declarative(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.put_imperative({}, IMPERATIVE_APP, b"graph")
    uid = _uid(store, "driven")
    store.replace({}, [{**HELLO, "name": "driven"}], None)
    assert _kinds(store) == {"driven": "declarative"}
    assert store.graph("driven") is None and _uid(store, "driven") == uid


def test_the_single_application_put_leaves_only_its_application(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.put_imperative({}, IMPERATIVE_APP, b"graph")
    store.replace({}, [HELLO], single_app=HELLO)
    assert _kinds(store) == {"hello": "declarative"}


def test_serve_run_again_with_the_same_graph_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.put_imperative({"started": "by serve.run"}, IMPERATIVE_APP, b"graph")
    uid = _uid(store, "driven")
    before = store.load()
    store.put_imperative({"ignored": "it runs"}, IMPERATIVE_APP, b"graph")
    assert store.load() == before
    assert before is not None and before.options == {"started": "by serve.run"}
    store.put_imperative({}, {**IMPERATIVE_APP, "pickled_graph_sha256": "cd"}, b"new graph")
    after = store.load()
    assert (
        after is not None
        and after.applications[0].deployed_at >= before.applications[0].deployed_at
    )
    assert store.graph("driven") == b"new graph" and _uid(store, "driven") == uid


def test_deleting_one_application_of_either_kind(tmp_path: Path) -> None:
    store = Store(tmp_path / "kubeserve.db")
    store.replace({}, [HELLO], None)
    store.put_imperative({}, IMPERATIVE_APP, b"graph")
    store.delete_app("driven")
    store.delete_app("hello")
    store.delete_app("never-there")
    assert _kinds(store) == {}


def test_an_older_database_gains_the_kind_of_each_application(tmp_path: Path) -> None:
    path = tmp_path / "kubeserve.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE applications (name TEXT PRIMARY KEY, config TEXT NOT NULL, "
        "deployed_at REAL NOT NULL, position INTEGER NOT NULL, uid TEXT NOT NULL DEFAULT '');"
        "CREATE TABLE instance (id INTEGER PRIMARY KEY CHECK (id = 1), options TEXT NOT NULL, "
        "single_app TEXT, started_at REAL NOT NULL);"
        "INSERT INTO instance VALUES (1, '{}', NULL, 1.0);"
        """INSERT INTO applications VALUES ('hello', '{"name":"hello"}', 1.0, 0, 'u1');"""
    )
    db.commit()
    db.close()
    assert _kinds(Store(path)) == {"hello": "declarative"}
