"""``ray.util`` on kubeserve: only :mod:`ray.util.metrics`, the metrics a Serve application
records. The rest of ``ray.util`` (actor pools, placement groups, queues...) is Ray core."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["metrics"]


def __getattr__(name: str) -> Any:
    if name == "metrics":
        return importlib.import_module(f"{__name__}.metrics")
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"ray.util.{name} is part of Ray core, which kubeserve does not provide: only "
        "ray.util.metrics is"
    )
