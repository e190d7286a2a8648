"""The data plane's own Prometheus writer (``runtime.prometheus``) against prometheus_client: the
same values recorded with both are read back the same, from the multiprocess files (merged by
prometheus_client's ``MultiProcessCollector``, as the controller does) and from the text
exposition (parsed by prometheus_client's parser, as Prometheus reads a pod)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import prometheus_client
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from kubeserve.runtime import prometheus
from support.common import ROOT

AWKWARD = 'a\\b"c\nd\re'
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 1000, 1500000)


def record(lib: Any, registry: Any, label: Any = str) -> None:
    """The same metrics and values, written with ``lib`` (prometheus_client or ours) into
    ``registry``; ``label`` is how an awkward label value is given to ``lib``."""
    requests = lib.Counter(
        "demo_requests", "Requests.\nSecond \\ line", ["route", "code"], registry=registry
    )
    requests.labels("/a", "200").inc(3)
    requests.labels("/a", "500").inc()
    requests.labels(label(AWKWARD), "200").inc(0.5)
    untagged = lib.Counter("demo_untagged_total", "Without labels.", registry=registry)
    (untagged if lib is prometheus_client else untagged.labels()).inc(7)
    lib.Counter("demo_idle", "A counter never written.", ["x"], registry=registry)
    ongoing = lib.Gauge(
        "demo_ongoing", "Ongoing.", ["node"], registry=registry, multiprocess_mode="livesum"
    )
    ongoing.labels("n1").set(4)
    ongoing.labels("n2").set(2.5)
    ongoing.labels("n2").inc(1)
    every = lib.Gauge("demo_every", "Per process.", ["k"], registry=registry)  # mode "all"
    every.labels("v").set(-3)
    latency = lib.Histogram(
        "demo_latency_ms", "Latency.", ["route"], registry=registry, buckets=BUCKETS
    )
    for value in (0.5, 1, 1.5, 3, 99, 100, 101, 2000000, 7):
        latency.labels("/a").observe(value)
    latency.labels("/b").observe(20)
    latency.labels("/c")  # a series with no observation yet
    bare = lib.Histogram("demo_bare", "No labels.", registry=registry, buckets=(0.25, 1e6))
    bare = bare if lib is prometheus_client else bare.labels()
    bare.observe(0.1)
    bare.observe(1e7)
    # a metric of user code: the label name "my-key" cannot be written as it is
    lib.Gauge(
        "ray_user_gauge", "User's.", ["my-key"], registry=registry, multiprocess_mode="livesum"
    ).labels("x").set(1)


def _file_label(text: str) -> str:
    return text.replace("\r", "\\r")


WRITER = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import prometheus_client
from kubeserve.runtime import prometheus
from test_prometheus import record, _file_label
record(prometheus_client, None, _file_label)
record(prometheus, prometheus.Registry(sys.argv[1]))
"""


def _families(
    collected: Any,
) -> dict[str, tuple[str, str, list[tuple[str, tuple[Any, ...], float]]]]:
    """name -> (type, help, samples sorted), without ``_created`` series."""
    found = {}
    for family in collected:
        samples = sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for s in family.samples
            if not s.name.endswith("_created")
        )
        if family.name.endswith("_created"):
            continue
        found[family.name] = (family.type, family.documentation, samples)
    return found


def test_the_multiprocess_files_merge_as_prometheus_clients_own(tmp_path: Path) -> None:
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    theirs.mkdir()
    ours.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(theirs)}
    subprocess.run([sys.executable, "-c", WRITER, str(ours)], check=True, cwd=ROOT, env=env)
    assert {p.name for p in ours.iterdir()} == {p.name for p in theirs.iterdir()}
    expected = _families(MultiProcessCollector(None, path=str(theirs)).collect())
    assert expected["demo_latency_ms"][2]  # the comparison compares something
    assert _families(MultiProcessCollector(None, path=str(ours)).collect()) == expected
    # the live gauges of a dead process go; its counters stay
    pid = int(next(ours.glob("counter_*.db")).stem.split("_")[1])
    mark_process_dead(pid, str(ours))
    mark_process_dead(pid, str(theirs))
    assert not list(ours.glob("gauge_livesum_*"))
    assert _families(MultiProcessCollector(None, path=str(ours)).collect()) == _families(
        MultiProcessCollector(None, path=str(theirs)).collect()
    )


def test_a_process_with_a_dead_ones_pid_continues_its_counters(tmp_path: Path) -> None:
    first = prometheus.Registry(str(tmp_path))
    prometheus.Counter("again", "Again.", ["k"], registry=first).labels("v").inc(2)
    second = prometheus.Registry(str(tmp_path))  # the same pid, so the same file
    child = prometheus.Counter("again", "Again.", ["k"], registry=second).labels("v")
    child.inc(3)
    (family,) = MultiProcessCollector(None, path=str(tmp_path)).collect()
    assert [(s.name, s.value) for s in family.samples] == [("again_total", 5.0)]


def test_the_text_exposition_reads_as_prometheus_clients_own() -> None:
    theirs = prometheus_client.CollectorRegistry()
    record(prometheus_client, theirs, _file_label)
    ours = prometheus.Registry()
    record(prometheus, ours)
    text = ours.exposition().decode()
    assert "\r" not in text
    # line for line, less prometheus_client's _created series
    their_text = prometheus_client.generate_latest(theirs).decode()
    assert text.splitlines() == [line for line in their_text.splitlines() if "_created" not in line]
    expected = _families(
        text_string_to_metric_families(prometheus_client.generate_latest(theirs).decode())
    )
    assert _families(text_string_to_metric_families(text)) == expected
    assert set(expected) >= {"demo_requests", "demo_idle", "demo_latency_ms", "ray_user_gauge"}


def test_a_family_is_registered_once_and_takes_as_many_label_values_as_names() -> None:
    registry = prometheus.Registry()
    counter = prometheus.Counter("once", "Once.", ["a"], registry=registry)
    for call in (
        lambda: prometheus.Gauge("once", "Again.", registry=registry),
        lambda: counter.labels("x", "y"),
        lambda: counter.labels("x").inc(-1),
        lambda: prometheus.Histogram("h", "H.", ["le"], registry=registry, buckets=(1,)),
        lambda: prometheus.Gauge("g", "G.", registry=registry, multiprocess_mode="most"),
        lambda: prometheus.Counter("1bad", "Bad.", registry=registry),
    ):
        try:
            call()
        except ValueError:
            continue
        raise AssertionError("accepted")
