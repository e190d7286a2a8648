"""Access lines written in batches (``runtime.logs.AccessLog``): the format a record would have,
and size rotation between lines."""

from __future__ import annotations

import json
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeserve.runtime import logs
from kubeserve.runtime.native_module import NATIVE
from kubeserve.runtime.replica.tally import PyTally

#: the tallies a replica may have: the pure Python one, and the compiled one when it is built
TALLIES = [
    "python",
    pytest.param(
        "compiled",
        marks=pytest.mark.skipif(NATIVE is None, reason="kubeserve._native is not built"),
    ),
]


def new_tally(kind: str, bounds: tuple[float, ...], batched: logs.AccessLog) -> Any:
    """A tally of ``kind`` formatting its lines as ``batched`` does (``ReplicaState``'s)."""
    tally = PyTally(bounds) if kind == "python" else NATIVE.Tally(list(bounds))  # type: ignore[union-attr]
    line_format = batched.native_format()
    tally.access_format(line_format["json"], line_format["component"])
    return tally


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """:func:`logs.configure` sets up this process's root logger: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = (logs._active, logs._output, logs._batched)
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logs._active, logs._output, logs._batched = saved


def replica_component(name: str = "Echo") -> logs.ComponentLog:
    return logs.ComponentLog("replica", name, f"{name}-1-abc", "echo", name)


def test_a_replicas_json_access_line_has_the_fields_of_its_record(
    tmp_path: Path, restored_logging: None
) -> None:
    handler = logging.handlers.RotatingFileHandler(tmp_path / "r.log", encoding="utf-8")
    logs.configure(logs.LogSettings({"encoding": "JSON"}), replica_component(), handler)
    batched = logs.batched_access()
    assert batched is not None
    batched.add("CALL", "greet", "OK", 1.25, "req-9", "/greet")
    batched.flush()
    (line,) = (tmp_path / "r.log").read_text().splitlines()
    record = json.loads(line)
    assert record["message"] == "CALL greet OK 1.2ms"
    assert (record["application"], record["deployment"], record["replica"]) == (
        "echo",
        "Echo",
        "Echo-1-abc",
    )
    assert (record["request_id"], record["route"], record["levelname"]) == (
        "req-9",
        "/greet",
        "INFO",
    )
    assert record["component_type"] == "replica" and "asctime" in record


def test_no_batched_lines_when_access_lines_are_off_or_must_be_records(
    restored_logging: None,
) -> None:
    handler = logging.StreamHandler()
    for config in (
        {"enable_access_log": False},
        {"log_level": "WARNING"},
        {"additional_log_standard_attrs": ["name"]},
    ):
        logs.configure(logs.LogSettings(config), replica_component(), handler)
        assert logs.batched_access() is None, config
    logs.configure(logs.LogSettings({}), replica_component(), handler)
    assert logs.batched_access() is not None


def _rotating_access(path: Path) -> Any:
    """The batched access log of a replica whose log file ``path`` rolls over at 1,000 bytes
    (3 backups)."""
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=1000, backupCount=3, encoding="utf-8"
    )
    logs.configure(logs.LogSettings({}), replica_component(), handler)
    batched = logs.batched_access()
    assert batched is not None
    return batched


@pytest.mark.parametrize("via_tally", [False, *TALLIES])
def test_a_batch_rolls_the_file_over_between_lines(
    tmp_path: Path, restored_logging: None, via_tally: str | bool
) -> None:
    """Lines added one by one, or a replica's tally (either) written in one block."""
    path = tmp_path / "r.log"
    batched = _rotating_access(path)
    tally = new_tally(via_tally or "python", (1.0,), batched)
    for i in range(30):  # about 80 bytes each: 2400 bytes in one batch
        if via_tally:
            tally.done(0.0, 0.001, "/echo", "GET", "/echo", 200, f"r{i:03d}", "/echo")
        else:
            batched.add("GET", "/echo", 200, 1.0, f"r{i:03d}")
    batched.write_tally(tally)
    batched.flush()
    files = sorted(tmp_path.glob("r.log*"))
    assert [p.name for p in files] == ["r.log", "r.log.1", "r.log.2"]
    assert all(p.stat().st_size <= 1000 for p in files)
    text = "".join(p.read_text() for p in reversed(files))
    assert [line.split()[5] for line in text.splitlines()] == [f"r{i:03d}" for i in range(30)]


def test_text_access_lines_are_those_the_record_formatter_writes(
    tmp_path: Path, restored_logging: None
) -> None:
    """Batched TEXT lines (with a request id as bytes or str, or none; a status name; times
    across a second; a deployment named with a %) read exactly as the TEXT formatter writes a
    record at the same time."""
    handler = logging.handlers.RotatingFileHandler(tmp_path / "r.log", encoding="utf-8")
    component = replica_component("Echo%d")
    logs.configure(logs.LogSettings({}), component, handler)
    batched = logs.batched_access()
    assert batched is not None
    entries = [
        (1_795_000_000.0015, "GET", "/echo", 200, 0.25, b"0123abcd"),
        (1_795_000_000.9999, "CALL", "greet", "OK", 12.55, "req-9"),
        (1_795_000_001.5, "POST", "/echo", 503, 1234.5, None),
    ]
    expected = []
    for at, method, route, status, latency_ms, request_id in entries:
        batched._pending.append((at, method, route, status, latency_ms, request_id, route))
        record = logging.makeLogRecord(
            {"msg": logs.access_message(method, route, status, latency_ms), "levelname": "INFO"}
        )
        record.created, record.msecs = at, int((at - int(at)) * 1000)
        record.request_id = request_id.decode() if isinstance(request_id, bytes) else request_id
        component.filter(record)
        expected.append(handler.formatter.format(record))  # type: ignore[union-attr]
    batched.flush()
    assert (tmp_path / "r.log").read_text().splitlines() == expected


#: (ended at, method, route, status, latency ms, request id) of a replica's requests
TALLIED = [
    (1_795_000_000.0015, "GET", "/echo", 200, 0.25, "0123abcd"),
    (1_795_000_000.9999, "CALL", "greet", "OK", 12.55, "req-9"),
    (1_795_000_001.5, "POST", "/echo", "CANCELLED", 1234.5, ""),
]


def _tallied(tally: Any) -> None:
    """``TALLIED`` recorded in ``tally``, each at its time."""
    for at, method, route, status, latency_ms, request_id in TALLIED:
        tally.done(0.0, latency_ms / 1000.0, route, method, route, status, request_id, route, at)


@pytest.mark.parametrize("kind", TALLIES)
@pytest.mark.parametrize("encoding", ["TEXT", "JSON"])
def test_a_replicas_tallied_lines_are_those_its_access_log_writes_for_the_same_requests(
    tmp_path: Path, restored_logging: None, encoding: str, kind: str
) -> None:
    """A replica's lines come out of its tally (``runtime.replica.tally``, the pure Python one
    or the compiled one), formatted in one block: byte for byte what :meth:`AccessLog.add`
    writes for the same requests."""
    component = replica_component("Echo%d")
    written = []
    for via_tally in (False, True):
        path = tmp_path / f"{via_tally}.log"
        handler = logging.handlers.RotatingFileHandler(path, encoding="utf-8")
        logs.configure(logs.LogSettings({"encoding": encoding}), component, handler)
        batched = logs.batched_access()
        assert batched is not None
        if via_tally:
            tally = new_tally(kind, (1.0, 5.0), batched)
            _tallied(tally)
            assert tally.lines() == len(TALLIED)
            batched.write_tally(tally)
            assert tally.lines() == 0
        else:
            for at, method, route, status, latency_ms, request_id in TALLIED:
                latency = (latency_ms / 1000.0 - 0.0) * 1000.0
                batched._pending.append((at, method, route, status, latency, request_id, route))
            batched.flush()
        handler.close()
        written.append(path.read_text())
    assert written[0] == written[1]
    assert written[1].count("\n") == len(TALLIED)


def test_the_tally_counts_each_route_in_rays_buckets() -> None:
    tally = PyTally((1.0, 5.0))
    assert tally.done(0.0, 0.0005, "/a") is True  # the first record since the last take
    assert tally.done(0.0, 0.001, "/a") is False
    tally.done(0.0, 0.007, "/b", "GET", "/b", 200, "", "/b")
    batches = tally.take_metrics()
    assert [(route, count, buckets) for route, count, _, buckets in batches] == [
        ("/a", 2, [2, 0, 0]),  # 0.5 ms and 1 ms: at most 1 (bisect_left, Ray's le)
        ("/b", 1, [0, 0, 1]),
    ]
    assert batches[0][2] == pytest.approx(1.5)
    assert tally.take_metrics() == [] and tally.done(0.0, 0.0, "/a") is True


def test_lines_formatted_elsewhere_are_written_with_the_rotation_of_the_log(
    tmp_path: Path, restored_logging: None
) -> None:
    """The native data path's lines come as one text (``write_lines``): written in one write
    when they fit, else rolled over between lines as the log's own lines are, after none."""
    path = tmp_path / "r.log"
    batched = _rotating_access(path)
    batched.add("GET", "/echo", 200, 1.0, "own")
    native = "".join(
        f"INFO 2026-11-27 12:00:00,000 proxy n{i:03d} -- GET / 200 1.0ms\n" for i in range(40)
    )
    batched.write_lines(native)
    batched.write_lines("")
    files = sorted(tmp_path.glob("r.log*"))
    assert [p.name for p in files] == ["r.log", "r.log.1", "r.log.2"]
    assert all(p.stat().st_size <= 1000 for p in files)
    text = "".join(p.read_text() for p in reversed(files))
    # the line waiting here first (written with them), then theirs, whole and in order
    assert [line.split(" -- ")[0].split()[-1] for line in text.splitlines()] == [
        "own",
        *(f"n{i:03d}" for i in range(40)),
    ]


def test_the_native_format_is_the_lines_component_part(restored_logging: None) -> None:
    """What the native data path is given to format lines with: the TEXT line's component
    part, the JSON line's fields of the component as ``json.dumps`` writes them."""
    component = logs.ComponentLog("proxy", "proxy", 'node"1')
    text = logs.AccessLog(component, "TEXT").native_format()
    assert text == {"json": False, "component": ' proxy node"1 '}
    as_json = logs.AccessLog(component, "JSON").native_format()
    assert as_json["json"] is True
    assert json.loads("{" + as_json["component"] + "}") == {
        "filename": "proxy",
        "lineno": 0,
        "component_name": "proxy",
        "component_id": 'node"1',
        "component_type": "proxy",
    }


@pytest.mark.parametrize("kind", TALLIES)
def test_a_tally_holds_at_most_its_limit_of_lines_and_the_log_counts_the_rest(
    tmp_path: Path, restored_logging: None, kind: str
) -> None:
    """Between two flushes a tally keeps at most ``MAX_ACCESS_LINES`` lines: the rest are
    dropped, and counted as the log's dropped lines when it writes the others."""
    handler = logging.handlers.RotatingFileHandler(tmp_path / "r.log", encoding="utf-8")
    logs.configure(logs.LogSettings({}), replica_component(), handler)
    batched = logs.batched_access()
    assert batched is not None
    tally = new_tally(kind, (1.0,), batched)
    for _ in range(logs.MAX_ACCESS_LINES + 2):
        tally.done(0.0, 0.001, "/", "GET", "/", 200, "", "/", 1_795_000_000.0)
    assert tally.lines() == logs.MAX_ACCESS_LINES
    before = logs.dropped_lines()
    batched.write_tally(tally)
    handler.close()
    assert logs.dropped_lines() - before == 2 and tally.lines() == 0
    with (tmp_path / "r.log").open("rb") as written:
        assert sum(1 for _ in written) == logs.MAX_ACCESS_LINES
