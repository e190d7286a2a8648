"""The data-plane commands kubeserve starts itself, locally or in pods: ``proxy``, ``replica``,
``build`` and ``policy-host`` (each parses its own command line; the environment its launcher
sets is named in :mod:`kubeserve.runtime.wire`; what a cluster provides them is chosen by their
composition root, :mod:`kubeserve.runtime.kubernetes.pod`), and ``fetch-runtime-env`` (a pod's
init container)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from kubeserve.cli.command import Command


def _proxy(argv: list[str]) -> int:
    from kubeserve.runtime.kubernetes import pod

    return pod.proxy(argv)


def _replica(argv: list[str]) -> int:
    from kubeserve.runtime.kubernetes import pod

    return pod.replica(argv)


def _build(argv: list[str]) -> int:
    from kubeserve.runtime.kubernetes import pod

    return pod.build(argv)


def _policy_host(argv: list[str]) -> int:
    from kubeserve.runtime import policy_server

    return policy_server.main(argv)


def _no_arguments(_parser: argparse.ArgumentParser) -> None:
    """The process parses its own arguments."""


def _add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--working-dir")
    parser.add_argument("--py-module", action="append", default=[])
    parser.add_argument(
        "--packages", type=json.loads, help='the runtime_env\'s {"pip": ...} or {"uv": ...}'
    )


def _fetch_runtime_env(args: argparse.Namespace) -> int:
    from kubeserve.runtime.runtime_env import RuntimeEnvError, fetch_into

    try:
        asyncio.run(fetch_into(args.dest, args.working_dir, args.py_module, args.packages))
    except RuntimeEnvError as exc:
        print(f"kubeserve fetch-runtime-env: {exc}", file=sys.stderr)
        return 1
    return 0


COMMANDS = (
    Command(
        "fetch-runtime-env",
        "fetch working_dir / py_modules, install pip / uv packages (a pod's init container)",
        _add_fetch_arguments,
        _fetch_runtime_env,
    ),
    *(
        Command(name, f"run a {name} process", _no_arguments, passthrough=main)
        for name, main in (("proxy", _proxy), ("replica", _replica), ("build", _build))
    ),
    Command(
        "policy-host",
        "answer an application's custom autoscaling policies (a pod of its own on Kubernetes)",
        _no_arguments,
        passthrough=_policy_host,
    ),
)
