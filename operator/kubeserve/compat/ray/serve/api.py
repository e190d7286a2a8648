"""``ray.serve.api``: where Ray defines ``serve.run``, ``serve.deployment``...; each name here is
``ray.serve``'s own (the driver-side ones load on first use, as there)."""

from __future__ import annotations

from typing import Any

from kubeserve.compat.ray import serve as _serve


def __getattr__(name: str) -> Any:
    return getattr(_serve, name)
