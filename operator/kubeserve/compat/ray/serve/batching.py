"""``ray.serve.batching``: the ``@serve.batch`` decorator."""

from __future__ import annotations

from kubeserve.sdk.batching import batch

__all__ = ["batch"]
