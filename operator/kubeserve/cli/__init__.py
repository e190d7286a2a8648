"""The ``kubeserve`` command: kubeserve on this machine or on Kubernetes, and a client for both.

    kubeserve start      admin API + controller + proxy + replicas on this machine (SQLite state)
    kubeserve run        one application on this machine for development, like ``serve run``
    kubeserve operator   the Kubernetes operator and its admin API (the chart's Deployment)
    kubeserve deploy     PUT a config file (YAML or JSON) to a running kubeserve
    kubeserve status     print application and deployment statuses
    kubeserve config     print the deployed application configs
    kubeserve shutdown   shut down every application
    kubeserve logs       print (or --follow) the logs of an application's replicas
    kubeserve proxy | replica | build | policy-host | fetch-runtime-env
                         data-plane processes (started by kubeserve itself, locally or in pods)

This package is the only place that reads the command line and the environment: each command
module builds the one settings object of the layer that does the work (``start`` and ``run``:
:mod:`kubeserve.cli.start`; ``operator``: :mod:`kubeserve.cli.operator`; the client commands:
:mod:`kubeserve.cli.client`) and hands it over. The data-plane processes parse their own
command lines (:mod:`kubeserve.cli.data_plane`).
"""

from __future__ import annotations

import argparse

from kubeserve.cli import client, data_plane, operator, run, start
from kubeserve.cli.command import Command
from kubeserve.sdk import ray_namespace

__all__ = ["COMMANDS", "main"]

#: Every subcommand, in the order ``kubeserve --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    start.COMMAND,
    run.COMMAND,
    operator.COMMAND,
    *client.COMMANDS,
    *data_plane.COMMANDS,
)


def main(argv: list[str] | None = None) -> int:
    ray_namespace.install()  # `import ray` in anything this process imports is kubeserve's
    parser = argparse.ArgumentParser(prog="kubeserve", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    by_name: dict[str, Command] = {}
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name, help=command.help, add_help=command.passthrough is None
        )
        command.add_arguments(sub)
        by_name[command.name] = command
    args, rest = parser.parse_known_args(argv)
    command = by_name[args.command]
    if command.passthrough is not None:
        return command.passthrough(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    assert command.run is not None
    return command.run(args)
