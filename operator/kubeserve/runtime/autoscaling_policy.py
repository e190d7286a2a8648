"""The process that runs an application's custom autoscaling policies: ``python -m
kubeserve.runtime.autoscaling_policy APP [--import-path PATH --args JSON | --pickled]``.

A policy is user code, so it never runs in the controller: the controller starts this process in
the application's environment (the build's working directory, ``PYTHONPATH`` and variables), one
per application with a custom policy, and asks it over stdin/stdout, one JSON line each way:

* request: ``{"scope": "deployment" | "application", "policy": {"policy_function": ...,
  "policy_kwargs": {...}}, "contexts": {deployment: context}}`` where a context holds
  :class:`~kubeserve.sdk.autoscaling.AutoscalingContext`'s fields as JSON (the controller's
  :meth:`~kubeserve.control.autoscaling_state.DeploymentAutoscaler.policy_context`);
* answer: ``{"decisions": {deployment: number}}`` (the policy's raw counts, which the controller
  scales, delays and bounds as Ray does), or ``{"error": "..."}`` naming what the policy did wrong.

``--pickled``: the application was deployed with ``serve.run``; its pickled graph (base64) is the
first line of stdin. The process keeps what Ray's controller keeps between calls: each policy's
``policy_state`` (handed back in the next context) and a policy class's one instance, built with
``policy_kwargs``. Whatever the policy prints goes to stderr, so stdout stays the protocol's.

Where a policy comes from: its import path is imported; a name that does not import (a function
of ``__main__`` given to the decorator, named ``__main__.policy`` as Ray names it) is looked up
among the callables the application's own deployments set in code.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from kubeserve.runtime.build import (
    format_user_error,
    load_application,
    load_pickled_application,
    prepare_for_user_code,
)
from kubeserve.schema.config import AutoscalingConfig, policy_function_name
from kubeserve.sdk.application import Application
from kubeserve.sdk.autoscaling import AutoscalingContext
from kubeserve.sdk.context import DeploymentID, ReplicaID

__all__ = ["PolicyHost", "answer", "main", "serve"]


class PolicyError(Exception):
    """The policy cannot be found, raised, or answered something that is no decision."""


class PolicyHost:
    """Resolves policies by name, calls them, and keeps their state between calls."""

    def __init__(self, app_name: str, load_app: Callable[[], Application]) -> None:
        self.app_name = app_name
        self._load_app = load_app
        self._app: Application | None = None
        self._policies: dict[str, Callable[..., Any]] = {}
        self._state: dict[tuple[str, str], Any] = {}

    # -- finding the policy ----------------------------------------------------------------------
    def policy(self, spec: dict[str, Any]) -> Callable[..., Any]:
        name = str(spec.get("policy_function", ""))
        kwargs = spec.get("policy_kwargs") or {}
        key = json.dumps([name, kwargs], sort_keys=True)
        if key not in self._policies:
            found = self._find(name)
            policy: Any = found(**kwargs) if inspect.isclass(found) else found
            self._policies[key] = policy
        return self._policies[key]

    def _find(self, name: str) -> Any:
        try:
            return _import(name)
        except (ImportError, AttributeError, ValueError) as exc:
            from_code = self._from_code(name)
            if from_code is None:
                raise PolicyError(f"cannot import policy_function {name!r}: {exc}") from None
            return from_code

    def _from_code(self, name: str) -> Any:
        if self._app is None:
            self._app = self._load_app()
        for node in self._app.deployments():
            policy = (node.deployment.code_options.get("autoscaling_config") or {}).get("policy")
            function = (policy or {}).get("policy_function")
            if callable(function) and policy_function_name(function) == name:
                return function
        return None

    # -- calling it ------------------------------------------------------------------------------
    def decide(self, request: dict[str, Any]) -> dict[str, float]:
        policy = self.policy(request["policy"])
        scope = "application" if request.get("scope") == "application" else "deployment"
        contexts = {
            name: self._context(name, raw, scope) for name, raw in request["contexts"].items()
        }
        if scope == "application":
            return self._decide_application(policy, contexts)
        ((name, ctx),) = contexts.items()
        answer = policy(ctx)
        if not isinstance(answer, tuple | list) or len(answer) != 2:
            raise PolicyError(
                f"the policy returned {_shown(answer)}; expected a tuple "
                "(num_replicas, policy_state)"
            )
        count, state = answer
        self._state[("deployment", name)] = _checked_state(state)
        return {name: _checked_count(count)}

    def _decide_application(
        self, policy: Callable[..., Any], contexts: dict[str, AutoscalingContext]
    ) -> dict[str, float]:
        by_id = {ctx.deployment_id: ctx for ctx in contexts.values()}
        answer = policy(by_id)
        if not isinstance(answer, tuple | list) or len(answer) != 2:
            raise PolicyError(
                f"the application's policy returned {_shown(answer)}; expected a tuple "
                "(Dict[DeploymentID, num_replicas], Dict[DeploymentID, policy_state])"
            )
        counts, states = answer
        if not isinstance(counts, dict):
            raise PolicyError(
                f"the application's policy returned {_shown(counts)} as decisions; expected "
                "Dict[DeploymentID, num_replicas]"
            )
        decisions: dict[str, float] = {}
        for key, count in counts.items():
            name = _deployment_name(key)
            if name not in contexts:
                raise PolicyError(f"the policy decided for {key!r}, not an autoscaling deployment")
            decisions[name] = _checked_count(count)
        for key, state in (states or {}).items():
            self._state[("application", _deployment_name(key))] = _checked_state(state)
        return decisions

    def _context(self, name: str, raw: dict[str, Any], scope: str) -> AutoscalingContext:
        deployment_id = DeploymentID(name, self.app_name)
        return AutoscalingContext(
            deployment_id=deployment_id,
            deployment_name=name,
            app_name=self.app_name,
            current_num_replicas=raw["current_num_replicas"],
            target_num_replicas=raw["target_num_replicas"],
            running_replicas=[ReplicaID(r, deployment_id) for r in raw["running_replicas"]],
            total_num_requests=raw["total_num_requests"],
            total_queued_requests=raw["total_queued_requests"],
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=raw["capacity_adjusted_min_replicas"],
            capacity_adjusted_max_replicas=raw["capacity_adjusted_max_replicas"],
            policy_state=dict(self._state.get((scope, name)) or {}),
            last_scale_up_time=raw["last_scale_up_time"],
            last_scale_down_time=raw["last_scale_down_time"],
            current_time=raw["current_time"],
            config=AutoscalingConfig.model_validate(raw["config"]),
        )


def _import(name: str) -> Any:
    if ":" in name:
        module_name, _, attr = name.partition(":")
    else:
        module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise ValueError("expected 'module:function'")
    if module_name == "__main__":
        raise ImportError("a function of the driver script's __main__ is not importable")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{name!r} is a {type(target).__name__}, not a function or class")
    return target


def _deployment_name(key: Any) -> str:
    return key.name if isinstance(key, DeploymentID) else str(key)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:200]}"


def _checked_count(count: Any) -> float:
    if isinstance(count, bool) or not isinstance(count, int | float):
        raise PolicyError(
            f"the policy returned {_shown(count)} as the replica count; expected an int or a float"
        )
    return float(count)


def _checked_state(state: Any) -> dict[str, Any]:
    if state is None:
        return {}
    if not isinstance(state, dict):
        raise PolicyError(f"the policy returned {_shown(state)} as policy_state; expected a dict")
    return state


def answer(host: PolicyHost, request: bytes | str) -> dict[str, Any]:
    """The answer to one request of the protocol: the decisions, or the error that prevented
    them (the policy's own exception included: the host keeps serving)."""
    try:
        parsed = json.loads(request)
    except ValueError as exc:
        return {"error": f"unreadable request: {exc}"}
    try:
        return {"decisions": host.decide(parsed)}
    except PolicyError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the user's policy raised: report it, keep serving
        return {"error": f"the policy raised {format_user_error(exc)}"}


def serve(host: PolicyHost, requests: IO[str], answers: IO[str]) -> None:
    """Answer each request line with one answer line, until stdin closes."""
    for line in requests:
        if line.strip():
            answers.write(json.dumps(answer(host, line)) + "\n")
            answers.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeserve.runtime.autoscaling_policy")
    parser.add_argument("app")
    parser.add_argument("--import-path", default="")
    parser.add_argument("--args", default="{}")
    parser.add_argument("--pickled", action="store_true")
    options = parser.parse_args(argv)
    # The protocol keeps the real stdout; anything user code prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    prepare_for_user_code()
    graph = sys.stdin.readline().strip() if options.pickled else ""

    def load_app() -> Application:
        if options.pickled:
            return load_pickled_application(base64.b64decode(graph))
        return load_application(options.import_path, json.loads(options.args))

    serve(PolicyHost(options.app, load_app), sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
