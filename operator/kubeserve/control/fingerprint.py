"""A stable short digest of JSON-able data: what names a version of a config in kubeserve.

A leaf of the control layer with no imports of its own, so the data plane (a replica naming the
``user_config`` it applied) can use it without loading the schema models.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["fingerprint"]


def fingerprint(value: Any) -> str:
    """A stable short digest of JSON-able data (key order does not matter)."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
