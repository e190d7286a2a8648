"""The ``ray`` a Ray Serve application imports when it runs on kubeserve.

Serve applications touch little of Ray itself: ``ray.serve``, the errors of ``ray.exceptions``,
the metrics of ``ray.util.metrics``, and sometimes ``ray.init()`` or ``ray.is_initialized()``
guards. Those are here (the latter two as no-ops: a kubeserve process is
always "initialized"). Anything else of Ray core (``ray.remote``, ``ray.get``, actors, object
refs, Ray Data...) is not provided and fails with an error naming it, never with a half-working
stand-in.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["__version__", "exceptions", "init", "is_initialized", "serve", "shutdown", "util"]

#: The Ray release whose public Serve surface this layer follows.
__version__ = "2.60.0"

_SUBMODULES = frozenset({"exceptions", "serve", "util"})


def init(*args: Any, **kwargs: Any) -> None:
    """A no-op: kubeserve's processes need no connection to a Ray cluster."""


def is_initialized() -> bool:
    """Always true in a kubeserve process (see :func:`init`)."""
    return True


def shutdown(*args: Any, **kwargs: Any) -> None:
    """A no-op, as :func:`init`."""


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"ray.{name} is part of Ray core, which kubeserve does not provide: kubeserve runs "
        "Ray Serve applications (ray.serve) without Ray itself"
    )
