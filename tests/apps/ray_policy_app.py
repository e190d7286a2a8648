"""Custom autoscaling policies, written as Ray 2.60's documentation writes them."""

from __future__ import annotations

import os
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingContext


class FixedCount:
    """A policy class: built once with ``policy_kwargs``, called on every decision. Counts its
    calls in ``policy_state`` (kept between calls) and asks for ``count`` replicas."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        calls = ctx.policy_state.get("calls", 0) + 1
        return self.count, {"calls": calls}


def broken_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    raise RuntimeError("the policy exploded")


def garbage_policy(ctx: AutoscalingContext) -> Any:
    return "lots", {}


class PerDeployment:
    """An application-level policy: a count per deployment name, from ``policy_kwargs``."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def __call__(self, contexts: dict[Any, AutoscalingContext]) -> tuple[dict[Any, int], dict]:
        return {dep_id: self.counts[dep_id.name] for dep_id in contexts}, {}


@serve.deployment
class Scaled:
    def __call__(self) -> dict[str, int]:
        return {"pid": os.getpid()}


@serve.deployment
class Ingress:
    def __init__(self, other: Any) -> None:
        self.other = other

    def __call__(self) -> dict[str, int]:
        return {"pid": os.getpid()}


app = Scaled.bind()
two = Ingress.bind(Scaled.bind())


def hanging_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    import time

    time.sleep(3600)
    return 1, {}
