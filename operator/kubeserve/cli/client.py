"""The client commands: ``kubeserve deploy | status | config | shutdown | logs`` against a running
instance's admin API (``kubeserve start`` or the operator), through
:class:`~kubeserve.admin_client.AdminClient`."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from kubeserve.cli.command import AddArguments, Command, add_auth_argument, auth_token


def _with_address(add_own: AddArguments | None = None) -> AddArguments:
    """The options of a client command: the address, the command's own, the token."""

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-a", "--address")
        if add_own is not None:
            add_own(parser)
        add_auth_argument(parser, "send this bearer token (default: $KUBESERVE_AUTH_TOKEN)")

    return add


def _add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config_file", type=Path)
    parser.add_argument(
        "--wait",
        action="store_true",
        help="show progress until RUNNING (exit 0) or DEPLOY_FAILED/UNHEALTHY (exit 1)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")


def _add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app")
    parser.add_argument("deployment", nargs="?")
    parser.add_argument("-f", "--follow", action="store_true")
    parser.add_argument("--tail", type=int, default=100, help="lines of each log to start with")


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_client(args))


async def _client(args: argparse.Namespace) -> int:
    from kubeserve.admin_client import DEFAULT_ADDRESS, AdminClient

    address = args.address or os.environ.get("KUBESERVE_ADDRESS", DEFAULT_ADDRESS)
    client = AdminClient(address, auth_token(args))
    if args.command == "deploy":
        return await client.deploy(args.config_file, wait=args.wait, timeout_s=args.timeout)
    if args.command == "logs":
        return await client.logs(args.app, args.deployment, follow=args.follow, tail=args.tail)
    return await client.show(args.command)


COMMANDS = (
    Command(
        "deploy",
        "deploy a config file (multi-app if it has 'applications')",
        _with_address(_add_deploy_arguments),
        run,
    ),
    Command("status", "show statuses", _with_address(), run),
    Command("config", "show deployed configs", _with_address(), run),
    Command("shutdown", "shut everything down", _with_address(), run),
    Command(
        "logs",
        "print the logs of an application's replicas (on kubeserve start's machine)",
        _with_address(_add_logs_arguments),
        run,
    ),
)
