"""``ray.serve.metrics``: :mod:`ray.util.metrics` with the tags Ray Serve adds in a replica.

In a replica every metric gains the tag keys ``deployment`` and ``replica`` (and ``application``
when the replica's application has a name), first, with the replica's values as defaults; user
code may not use those keys itself (``ValueError``, as in Ray). A metric whose ``tag_keys`` name
``route`` gets the route prefix of the HTTP request being served when a record does not give one.
Outside a replica (a driver script) nothing is added.
"""

from __future__ import annotations

from typing import Any

from kubeserve.compat.ray.util import metrics as _metrics
from kubeserve.sdk import context

__all__ = ["Counter", "Gauge", "Histogram"]

DEPLOYMENT_TAG = "deployment"
REPLICA_TAG = "replica"
APPLICATION_TAG = "application"
ROUTE_TAG = "route"

_RESERVED = (DEPLOYMENT_TAG, REPLICA_TAG, APPLICATION_TAG)


def _serve_tags() -> dict[str, str]:
    """The tags of the replica this process runs (none outside a replica)."""
    replica = context.get_replica_context()
    if replica is None:
        return {}
    tags = {DEPLOYMENT_TAG: replica.deployment, REPLICA_TAG: replica.replica_tag}
    if replica.app_name:
        tags[APPLICATION_TAG] = replica.app_name
    return tags


def _refuse_reserved(keys: Any) -> None:
    for key in _RESERVED:
        if key in keys:
            raise ValueError(f"'{key}' tag is reserved for Ray Serve metrics")


def _tag_keys(tag_keys: tuple[str, ...] | None) -> tuple[str, ...]:
    if tag_keys and not isinstance(tag_keys, tuple):
        raise TypeError(f"tag_keys should be a tuple type, got: {type(tag_keys)}")
    serve = tuple(_serve_tags())
    if serve:
        _refuse_reserved(tag_keys or ())
    return serve + (tag_keys or ())


def _with_route(tag_keys: tuple[str, ...], tags: dict[str, str] | None) -> dict[str, str] | None:
    if ROUTE_TAG not in tag_keys or (tags and ROUTE_TAG in tags):
        return tags
    request = context.request_context.get()
    return {**(tags or {}), ROUTE_TAG: request.route if request is not None else ""}


class _ServeTags(_metrics.Metric):
    """Serve's default tags under the user's (mixed in before a :mod:`ray.util.metrics` class)."""

    def set_default_tags(self, default_tags: dict[str, str]) -> _metrics.Metric:
        serve = _serve_tags()
        if serve:
            _refuse_reserved(default_tags)
        return super().set_default_tags({**default_tags, **serve})


class Counter(_ServeTags, _metrics.Counter):
    """A Serve counter (see the module doc for the tags it gains)."""

    def __init__(
        self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(name, description, _tag_keys(tag_keys))
        self.set_default_tags({})

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        super().inc(value, _with_route(self._tag_keys, tags))


class Gauge(_ServeTags, _metrics.Gauge):
    """A Serve gauge (see the module doc for the tags it gains)."""

    def __init__(
        self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(name, description, _tag_keys(tag_keys))
        self.set_default_tags({})

    def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
        super().set(value, _with_route(self._tag_keys, tags))


class Histogram(_ServeTags, _metrics.Histogram):
    """A Serve histogram (see the module doc for the tags it gains)."""

    def __init__(
        self,
        name: str,
        description: str = "",
        boundaries: list[float] | None = None,
        tag_keys: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(name, description, boundaries, _tag_keys(tag_keys))
        self.set_default_tags({})

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        super().observe(value, _with_route(self._tag_keys, tags))
