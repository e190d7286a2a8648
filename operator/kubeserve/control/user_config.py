"""Which ``user_config`` a replica applies, and how the version it applied is named.

One owner per fact: the **replica** is the only one that knows what it applied. It applies a
``user_config`` when it starts and whenever it is told to, reports the version of the one it
applied in every health answer (:func:`kubeserve.runtime.wire.health_answer`), and treats a
request to apply the version it already applied as done (the user's ``reconfigure`` runs once per
change, however often a controller repeats itself). Controllers (``kubeserve start``'s and the
operator) never remember what they pushed: they read what each replica reports and push only to
a replica that reports another version than the desired one.

The precedence rule, for both backends: the application's config, when it sets ``user_config``
(even to null), else the deployment's decorator. Locally the effective config already holds the
result; on Kubernetes a replica pod reads the ServeApplication's override at start (its pod
template never carries the value, so changing it restarts nothing) and applies
:func:`resolve_user_config` of it.
"""

from __future__ import annotations

from typing import Any

from kubeserve.control.fingerprint import fingerprint

__all__ = ["needs_push", "resolve_user_config", "user_config_version"]


def resolve_user_config(code_default: Any, overridden: bool, override: Any) -> Any:
    """The ``user_config`` a replica applies: ``override`` when the application's config sets
    one (``overridden``, even to None), else the decorator's ``code_default``."""
    return override if overridden else code_default


def user_config_version(user_config: Any) -> str:
    """The version of a ``user_config`` value: equal values (whatever their key order) have
    equal versions."""
    return fingerprint(user_config)


def needs_push(reported: str | None, desired: str) -> bool:
    """Whether a replica that reported ``reported`` (None: it has not reported one yet, or runs
    a kubeserve that does not report) must be sent the ``desired`` version."""
    return reported != desired
