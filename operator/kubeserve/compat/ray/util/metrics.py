"""``ray.util.metrics``: Ray's custom metrics (``Counter``, ``Gauge``, ``Histogram``), written into
the Prometheus output of the process that records them.

Ray's semantics, name for name: a metric has a ``name``, a ``description`` and ``tag_keys`` (a
tuple); ``set_default_tags`` sets values of some keys (and returns the metric); every record
merges its ``tags`` over the defaults and must end with a value for each key (``ValueError``
otherwise). A name Prometheus cannot carry is warned about and the metric records nothing.

Where the samples go: Ray's metrics agent exports ``name`` as ``ray_<name>`` (a counter as
``ray_<name>_total``); so does kubeserve, through :func:`kubeserve.runtime.metrics.metric_family`.
In a replica of ``kubeserve start`` they reach the admin API's ``GET /metrics`` with the instance's
other series; on Kubernetes the replica pod's metrics port serves them. Ray's own process labels
(``WorkerId``, ``SessionName``...) are not added: a series carries the metric's tags only.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from kubeserve.runtime import prometheus
from kubeserve.runtime.metrics import metric_family

__all__ = ["Counter", "Gauge", "Histogram", "Metric"]

#: The metric names Prometheus accepts (Ray checks the same).
_VALID_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

#: Ray's metrics agent exports user metrics in this namespace.
EXPORT_PREFIX = "ray_"


class Metric:
    """A metric of user code: what :class:`Counter`, :class:`Gauge` and :class:`Histogram`
    share."""

    _kind: Any = None

    def __init__(
        self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None
    ) -> None:
        if not name:
            raise ValueError("Empty name is not allowed. Please provide a metric name.")
        self._discard_metric = not _VALID_NAME.match(name)
        if self._discard_metric:
            warnings.warn(
                f"Invalid metric name: {name}. Metric will be discarded and data will not be "
                "collected or published. Metric names can only contain letters, numbers, _, "
                "and :. Metric names cannot start with numbers.",
                UserWarning,
                stacklevel=2,
            )
        self._name = name
        self._description = description
        self._default_tags: dict[str, str] = {}
        self._tag_keys: tuple[str, ...] = tag_keys or ()
        if not isinstance(self._tag_keys, tuple):
            raise TypeError(f"tag_keys should be a tuple type, got: {type(self._tag_keys)}")
        for key in self._tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"Tag keys must be str, got {type(key)}.")
        self._family: Any = None

    def _bind(self, **kw: Any) -> None:
        """Create (or find) the Prometheus family; subclasses call it once set up."""
        if not self._discard_metric:
            self._family = metric_family(
                self._kind, EXPORT_PREFIX + self._name, self._description or self._name,
                self._tag_keys, **kw,
            )  # fmt: skip

    def set_default_tags(self, default_tags: dict[str, str]) -> Metric:
        """Values for some tag keys, used by every record that does not give its own."""
        for key, value in default_tags.items():
            if key not in self._tag_keys:
                raise ValueError(f"Unrecognized tag key {key}.")
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)}.")
        self._default_tags = default_tags
        return self

    def _child(self, tags: dict[str, str] | None) -> Any:
        """The labelled series a record goes to (``None`` for a discarded metric)."""
        final = self._default_tags
        if tags:
            for value in tags.values():
                if not isinstance(value, str):
                    raise TypeError(f"Tag values must be str, got {type(value)}.")
            final = {**self._default_tags, **tags}
        missing = [key for key in self._tag_keys if key not in final]
        if missing:
            raise ValueError(f"Missing value for tag key(s): {','.join(missing)}.")
        if self._family is None:
            return None
        return self._family.get(*(final[key] for key in self._tag_keys))

    @property
    def info(self) -> dict[str, Any]:
        return {
            "name": self._name,
            "description": self._description,
            "tag_keys": self._tag_keys,
            "default_tags": self._default_tags,
        }


def _number(value: Any) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"value must be int or float, got {type(value)}.")
    return float(value)


class Counter(Metric):
    """A cumulative metric that only goes up (Prometheus' counter, ``ray_<name>_total``)."""

    _kind = prometheus.Counter

    def __init__(
        self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(name, description, tag_keys)
        self._bind()

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        """Add ``value`` (> 0; default 1)."""
        amount = _number(value)
        if amount <= 0:
            raise ValueError(f"value must be >0, got {value}")
        child = self._child(tags)
        if child is not None:
            child.inc(amount)


class Gauge(Metric):
    """The last value set (Prometheus' gauge)."""

    _kind = prometheus.Gauge

    def __init__(
        self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(name, description, tag_keys)
        # a replica's value while it lives (a restarted replica's old value goes with it)
        self._bind(multiprocess_mode="livesum")

    def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
        """Set the gauge to ``value`` (``None``: nothing)."""
        if value is None:
            return
        amount = _number(value)
        child = self._child(tags)
        if child is not None:
            child.set(amount)


class Histogram(Metric):
    """Observed values counted in buckets bounded by ``boundaries`` (Prometheus' histogram)."""

    _kind = prometheus.Histogram

    def __init__(
        self,
        name: str,
        description: str = "",
        boundaries: list[float] | None = None,
        tag_keys: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(name, description, tag_keys)
        if not boundaries:
            raise ValueError(
                "boundaries argument should be provided when using the Histogram class. e.g., "
                'Histogram("name", boundaries=[1.0, 2.0])'
            )
        for i, boundary in enumerate(boundaries):
            if boundary <= 0:
                raise ValueError(
                    f"Invalid `boundaries` argument at index {i}, {boundaries}. Use positive "
                    "values for the arguments."
                )
        self.boundaries = boundaries
        self._bind(buckets=sorted(boundaries))

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        """Count ``value`` in its bucket."""
        amount = _number(value)
        child = self._child(tags)
        if child is not None:
            child.observe(amount)

    @property
    def info(self) -> dict[str, Any]:
        return {**super().info, "boundaries": self.boundaries}
