"""When a custom resource's new status is written: at once when it says something new, paced
when only its progress moved.

A rolling application changes its status at every pod event: a replica created, scheduled,
ready, its user_config applied, an old one terminating. Each is a count or the message spelling
it (``"3/5 replicas ready"``), and written at once each was a status write per pod event (about
twenty per application change; a churn of a hundred applications was two thousand writes a
minute, each waking every watcher of the object). What a reader acts on (the application's and
its deployments' Ray statuses, the Ready condition, the generation observed, the route) is never
held back: a status that changes any of it is written at once, with the progress it carries.
A change of progress alone waits until :data:`PROGRESS_INTERVAL_S` passed since the object's
last status write, and is then written (its pass runs again then): progress is late by at most
that interval, and never lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The shortest time between two status writes of one object that only move its progress. A
#: roll on a busy cluster takes a minute (pods come up at a few a second): at 2 s, a churn of
#: twenty applications still wrote fifteen statuses per application.
PROGRESS_INTERVAL_S = 10.0

#: the status fields (camelCase, as written) that only say how far a change got, by where they
#: are: the status itself, each of its ``deployments`` entries, each of its ``conditions``
_PROGRESS = frozenset({"message", "replicas"})
_DEPLOYMENT_PROGRESS = frozenset({"message", "replicas", "readyReplicas"})
_CONDITION_PROGRESS = frozenset({"message"})


def progress_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the status patch ``new`` changes nothing of the status ``old`` but progress
    (counts and messages); True too when it changes nothing at all."""
    for key, value in new.items():
        before = old.get(key)
        if key in _PROGRESS or value == before:
            continue
        if key == "deployments":
            if not _same_entries(before, value, _DEPLOYMENT_PROGRESS):
                return False
        elif key == "conditions":
            if not _same_conditions(before, value):
                return False
        else:
            return False
    return True


def write_delay(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    last_written: float | None,
    now: float,
    interval_s: float = PROGRESS_INTERVAL_S,
) -> float:
    """Seconds until the status patch ``new`` over ``old`` is due (0: write it now), for an
    object whose status was last written at ``last_written`` (None: not by this process)."""
    if last_written is None or not progress_only(old, new):
        return 0.0
    return max(0.0, last_written + interval_s - now)


def _same_entries(before: Any, after: Any, progress: frozenset[str]) -> bool:
    """The same keys, each entry equal but for its ``progress`` fields."""
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return False
    if before.keys() != after.keys():
        return False
    return all(_without(before[k], progress) == _without(after[k], progress) for k in after)


def _same_conditions(before: Any, after: Any) -> bool:
    if not isinstance(before, list) or not isinstance(after, list) or len(before) != len(after):
        return False
    return all(
        _without(b, _CONDITION_PROGRESS) == _without(a, _CONDITION_PROGRESS)
        for b, a in zip(before, after, strict=True)
    )


def _without(entry: Any, fields: frozenset[str]) -> Any:
    if not isinstance(entry, Mapping):
        return entry
    return {k: v for k, v in entry.items() if k not in fields}
