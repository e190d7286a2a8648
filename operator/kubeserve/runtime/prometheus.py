"""Prometheus metrics of the data plane's processes: counters, gauges and histograms with labels,
written in the process and, under ``kubeserve start``, into prometheus_client's multiprocess files.

Why not prometheus_client: importing it loads ``http.server``, ``email``, ``wsgiref``... about
13 MB of a proxy's or replica's resident memory, for what these few classes do. The controller
still reads the files with prometheus_client (:mod:`kubeserve.runtime.metrics_merge`), so they are
written in exactly its 0.26 format:

* one file per kind and process in ``PROMETHEUS_MULTIPROC_DIR``: ``counter_{pid}.db``,
  ``histogram_{pid}.db``, ``gauge_{mode}_{pid}.db`` (``mode``: the gauge's multiprocess mode; the
  ``live*`` files of a dead process are deleted by the merge's ``mark_process_dead``);
* a file starts with its used length (int32) and 4 bytes of padding, then entries: the key's
  length (int32), the UTF-8 key padded with spaces to 8-byte alignment, the value and a timestamp
  (two doubles). A value is rewritten in place with one 16-byte slice assignment (never a
  ``pack_into``, which zeroes it for a moment);
* a key is ``json.dumps([family, sample, labels, help], sort_keys=True)``; samples are
  ``name_total`` (counter), ``name`` (gauge), ``name_sum`` and ``name_bucket`` with ``le`` as Go
  writes a float (histogram: per-bucket counts; the merge adds them up and derives ``_count``);
* a process whose pid a dead one had continues that one's counters (as prometheus_client does).

In the process every series also keeps its values in memory: :meth:`Registry.exposition` is the
Prometheus text format 0.0.4 of this process (a pod's metrics port), as prometheus_client's
``generate_latest`` writes it, less its ``_created`` series (the merged output never had them).

Thread safety: a write holds its registry's lock (user code records from worker threads). After a
``fork`` the child writes its own files, from zero, as prometheus_client's child would.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

__all__ = [
    "MULTIPROC_ENV",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
    "go_float",
    "label_value",
    "process_registry",
]

#: Where a process of ``kubeserve start`` writes its samples (prometheus_client's variable).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

INF = float("inf")

_INITIAL_FILE_SIZE = 1 << 16
_INT = struct.Struct("i")
_TWO_DOUBLES = struct.Struct("dd")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NOT_IN_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
_GAUGE_MODES = frozenset(
    ("all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent",
     "livemostrecent")
)  # fmt: skip


def go_float(value: float) -> str:
    """``value`` as Prometheus' Go code writes it (prometheus_client's ``floatToGoString``):
    ``+Inf``, ``-Inf``, ``NaN``, an exponent from 1e+06 up."""
    if value == INF:
        return "+Inf"
    if value == -INF:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def label_value(text: str) -> str:
    """``text`` escaped for a label value of the Prometheus text format: backslash, double quote
    and line feed as the format says; a carriage return, which the format leaves raw and which
    line-splitting readers take for a line end, as the text ``\\r`` (read back: a backslash and
    an ``r``)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return escaped.replace("\r", "\\\\r")


def _file_label_value(text: str) -> str:
    """A label value as the multiprocess files hold it: the merge's exposition escapes backslash,
    quote and line feed (:func:`label_value`'s rule) but writes a carriage return raw."""
    return text.replace("\r", "\\r") if "\r" in text else text


def _label_name(name: str) -> str:
    """A label name of the text format: characters it cannot carry become ``_`` (as
    prometheus_client's exposition writes them)."""
    if _LABEL_NAME.match(name):
        return name
    return ("_" if name[0].isdigit() else name[0]) + _NOT_IN_LABEL_NAME.sub("_", name[1:])


def _labels_text(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{_label_name(k)}="{label_value(v)}"' for k, v in sorted(pairs))
    return "{" + text + "}" if text else ""


class _MmapFile:
    """One multiprocess file of this process (see the module docstring for the layout)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a+b")  # noqa: SIM115 (open while the process writes)
        capacity = os.fstat(self._file.fileno()).st_size
        if capacity == 0:
            self._file.truncate(_INITIAL_FILE_SIZE)
            capacity = _INITIAL_FILE_SIZE
        self._capacity = capacity
        self._map = mmap.mmap(self._file.fileno(), capacity, access=mmap.ACCESS_WRITE)
        self._positions: dict[str, int] = {}
        self._used: int = _INT.unpack_from(self._map, 0)[0]
        if self._used == 0:
            self._used = 8
            self._map[0:4] = _INT.pack(self._used)
        else:  # a dead process had this pid: its entries go on
            pos = 8
            while pos < self._used:
                length = _INT.unpack_from(self._map, pos)[0]
                key = self._map[pos + 4 : pos + 4 + length].decode()
                pos += 4 + length + (8 - (length + 4) % 8)
                self._positions[key] = pos
                pos += 16

    def cell(self, key: str) -> tuple[int, float]:
        """The position of ``key``'s value (appended at 0 when new) and the value there."""
        pos = self._positions.get(key)
        if pos is None:
            pos = self._positions[key] = self._append(key)
        return pos, _TWO_DOUBLES.unpack_from(self._map, pos)[0]

    def _append(self, key: str) -> int:
        encoded = key.encode()
        padded = encoded + b" " * (8 - (len(encoded) + 4) % 8)
        entry = _INT.pack(len(encoded)) + padded + _TWO_DOUBLES.pack(0.0, 0.0)
        while self._used + len(entry) > self._capacity:
            self._capacity *= 2
            self._file.truncate(self._capacity)
            self._map = mmap.mmap(self._file.fileno(), self._capacity, access=mmap.ACCESS_WRITE)
        self._map[self._used : self._used + len(entry)] = entry
        self._used += len(entry)
        self._map[0:4] = _INT.pack(self._used)
        return self._used - 16

    def write(self, pos: int, value: float, timestamp: float) -> None:
        self._map[pos : pos + 16] = _TWO_DOUBLES.pack(value, timestamp)

    def close(self) -> None:
        self._map.close()
        self._file.close()


class Registry:
    """The metric families of a process, and the directory of multiprocess files their values
    are also written to (None: in memory only). A family name is registered once."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self._families: dict[str, _Family[Any]] = {}
        self._files: dict[str, _MmapFile] = {}

    def register(self, family: _Family[Any]) -> None:
        with self.lock:
            if family.name in self._families:
                raise ValueError(f"a metric named {family.name} is registered already")
            self._families[family.name] = family

    def file(self, prefix: str) -> _MmapFile:
        """This process's file of ``prefix`` (``counter``, ``gauge_livesum``...)."""
        found = self._files.get(prefix)
        if found is None:
            assert self.directory is not None
            path = os.path.join(self.directory, f"{prefix}_{os.getpid()}.db")
            found = self._files[prefix] = _MmapFile(path)
        return found

    def forked(self) -> None:
        """In a forked child: its own files, its series from zero (the parent's stay its own)."""
        self.lock = threading.Lock()
        if self.directory is None:
            return
        for f in self._files.values():
            f.close()
        self._files.clear()
        for family in self._families.values():
            family.forked()

    def exposition(self) -> bytes:
        """The Prometheus text format (0.0.4) of every family, in registration order."""
        lines: list[str] = []
        for family in list(self._families.values()):
            family.write_text(lines)
        return "".join(lines).encode()


_process_registry: Registry | None = None


def process_registry() -> Registry:
    """This process's registry: with multiprocess files in ``PROMETHEUS_MULTIPROC_DIR`` when the
    process was started with it (``kubeserve start`` sets it; read once, at the first metric)."""
    global _process_registry
    if _process_registry is None:
        _process_registry = Registry(os.environ.get(MULTIPROC_ENV) or None)
    return _process_registry


def _after_fork() -> None:
    if _process_registry is not None:
        _process_registry.forked()


os.register_at_fork(after_in_child=_after_fork)


class _Series:
    """The values of one label set: the samples its family writes (one, or a histogram's sum and
    buckets), each mirrored to a cell of a multiprocess file when the registry has them."""

    __slots__ = ("_family", "_file", "_label_values", "_lock", "_positions", "values")

    def __init__(self, family: _Family[Any], label_values: tuple[str, ...]) -> None:
        self._family = family
        self._label_values = label_values
        self._lock = family.registry.lock
        self.values = [0.0] * len(family.cells)
        self._file: _MmapFile | None = None
        self._positions: list[int] = []
        if family.registry.directory is not None:
            self._bind_cells()

    def _bind_cells(self) -> None:
        family = self._family
        self._file = family.registry.file(family.file_prefix)
        labels = dict(
            zip(family.labelnames, map(_file_label_value, self._label_values), strict=True)
        )
        self._positions = []
        for i, (sample, le) in enumerate(family.cells):
            cell_labels = labels if le is None else {**labels, "le": le}
            key = json.dumps(
                [family.name, sample, cell_labels, family.documentation], sort_keys=True
            )
            pos, self.values[i] = self._file.cell(key)
            self._positions.append(pos)

    def forked(self) -> None:
        self._lock = self._family.registry.lock
        self._bind_cells()

    def _add(self, i: int, amount: float) -> None:
        """Add to sample ``i``; the caller holds the lock."""
        value = self.values[i] = self.values[i] + amount
        if self._file is not None:
            self._file.write(self._positions[i], value, 0.0)


class CounterChild(_Series):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self._add(0, amount)


class GaugeChild(_Series):
    __slots__ = ()

    def set(self, value: float) -> None:
        with self._lock:
            self.values[0] = value = float(value)
            if self._file is not None:
                stamp = time.time() if self._family.most_recent else 0.0
                self._file.write(self._positions[0], value, stamp)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._add(0, amount)

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)


class HistogramChild(_Series):
    """Sample 0 is the sum; sample ``1 + i`` counts the values of bucket ``i`` alone."""

    __slots__ = ()

    def observe(self, amount: float) -> None:
        bucket = bisect_left(self._family.upper_bounds, amount)
        with self._lock:
            self._add(0, amount)
            self._add(1 + bucket, 1.0)

    def add(self, total: float, counts: Sequence[int]) -> None:
        """A batch of observations: their ``total`` and how many fell in each bucket."""
        with self._lock:
            self._add(0, total)
            for i, n in enumerate(counts, 1):
                if n:
                    self._add(i, n)


S = TypeVar("S", bound=_Series)


class _Family(Generic[S]):
    """A metric family: its name, help, label names and labelled series (of type ``S``)."""

    kind: ClassVar[str]
    #: the class of its series (a class attribute of each kind)
    child: type[S]
    #: the samples of a series, as (sample name, ``le`` label or None)
    cells: tuple[tuple[str, str | None], ...]
    file_prefix: str
    most_recent = False
    upper_bounds: tuple[float, ...] = ()

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        registry: Registry | None = None,
    ) -> None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        for label in self.labelnames:
            if label.startswith("__") or not label or (self.kind == "histogram" and label == "le"):
                raise ValueError(f"reserved or empty label name {label!r}")
        self.registry = registry or process_registry()
        self._children: dict[tuple[str, ...], S] = {}
        self.registry.register(self)
        if not self.labelnames:
            self.labels()

    def labels(self, *values: str) -> S:
        """The series of these label values (created at zero the first time)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes {len(self.labelnames)} label values")
            values = tuple(map(str, values))
            with self.registry.lock:
                child = self._children.get(values)
                if child is None:
                    child = self._children[values] = self.child(self, values)
        return child

    def forked(self) -> None:
        for child in self._children.values():
            child.forked()

    def _head(self, lines: list[str], name: str) -> None:
        doc = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n")

    def write_text(self, lines: list[str]) -> None:
        self._head(lines, self.cells[0][0])
        for values, child in list(self._children.items()):
            labels = _labels_text(zip(self.labelnames, values, strict=True))
            lines.append(f"{self.cells[0][0]}{labels} {go_float(child.values[0])}\n")


class Counter(_Family[CounterChild]):
    """A counter: its samples are ``name_total`` (a ``name`` ending ``_total`` loses it, as in
    prometheus_client)."""

    kind = "counter"
    child = CounterChild
    file_prefix = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        registry: Registry | None = None,
    ) -> None:
        name = name.removesuffix("_total")
        self.cells = ((f"{name}_total", None),)
        super().__init__(name, documentation, labelnames, registry)


class Gauge(_Family[GaugeChild]):
    """A gauge; ``multiprocess_mode`` says how the merge combines the processes' values."""

    kind = "gauge"
    child = GaugeChild

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        registry: Registry | None = None,
        multiprocess_mode: str = "all",
    ) -> None:
        if multiprocess_mode not in _GAUGE_MODES:
            raise ValueError(f"invalid multiprocess mode {multiprocess_mode!r}")
        self.multiprocess_mode = multiprocess_mode
        self.most_recent = multiprocess_mode.endswith("mostrecent")
        self.file_prefix = f"gauge_{multiprocess_mode}"
        self.cells = ((name, None),)
        super().__init__(name, documentation, labelnames, registry)


class Histogram(_Family[HistogramChild]):
    """A histogram over ``buckets`` (sorted upper bounds; ``+Inf`` is added)."""

    kind = "histogram"
    child = HistogramChild
    file_prefix = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        registry: Registry | None = None,
        buckets: Sequence[float] = (),
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        self.upper_bounds = tuple(bounds)
        self.cells = ((f"{name}_sum", None), *((f"{name}_bucket", go_float(b)) for b in bounds))
        super().__init__(name, documentation, labelnames, registry)

    def write_text(self, lines: list[str]) -> None:
        self._head(lines, self.name)
        name = self.name
        for values, child in list(self._children.items()):
            pairs = list(zip(self.labelnames, values, strict=True))
            labels = _labels_text(pairs)
            counts = child.values
            total = 0.0
            for i, (_, le) in enumerate(self.cells[1:], 1):
                total += counts[i]
                assert le is not None
                lines.append(
                    f"{name}_bucket{_labels_text([*pairs, ('le', le)])} {go_float(total)}\n"
                )
            lines.append(f"{name}_count{labels} {go_float(total)}\n")
            if self.upper_bounds[0] >= 0:
                lines.append(f"{name}_sum{labels} {go_float(counts[0])}\n")
