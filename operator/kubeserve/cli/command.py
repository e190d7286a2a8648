"""What one ``kubeserve`` subcommand is, and the options several of them share.

A command module adds its options to its own parser and turns the parsed options into the one
settings object of the layer that does the work; reading the command line and the environment
happens here and in the command modules only (:mod:`kubeserve.cli`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The admin API's bearer token, for ``kubeserve start`` and the client commands alike.
AUTH_TOKEN_ENV = "KUBESERVE_AUTH_TOKEN"
#: The log format of kubeserve's own long-running commands (``start``, ``run``, ``operator``).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


AddArguments = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and help line, its options, and what runs it.

    ``run`` gets the parsed options; a ``passthrough`` command instead gets every argument after
    its name unparsed (the data-plane processes parse their own command lines).
    """

    name: str
    help: str
    add_arguments: AddArguments
    run: Callable[[argparse.Namespace], int] | None = None
    passthrough: Callable[[list[str]], int] | None = None


def add_auth_argument(parser: argparse.ArgumentParser, helptext: str) -> None:
    parser.add_argument("--auth-token-file", type=Path, metavar="FILE", help=helptext)


def auth_token(args: argparse.Namespace) -> str | None:
    """The admin API's bearer token: ``--auth-token-file`` (surrounding whitespace stripped),
    else ``$KUBESERVE_AUTH_TOKEN``, else none. A missing or empty file stops the command."""
    path: Path | None = args.auth_token_file
    if path is None:
        return os.environ.get(AUTH_TOKEN_ENV) or None
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"kubeserve: cannot read --auth-token-file {path}: {exc}") from None
    if not token:
        raise SystemExit(f"kubeserve: --auth-token-file {path} is empty")
    return token


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
