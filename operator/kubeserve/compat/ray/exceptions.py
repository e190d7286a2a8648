"""``ray.exceptions``: Ray core's public exceptions (:mod:`kubeserve.sdk.ray_errors`)."""

from __future__ import annotations

from kubeserve.sdk.ray_errors import *  # noqa: F403
from kubeserve.sdk.ray_errors import __all__ as __all__
