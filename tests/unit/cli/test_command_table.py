"""The ``kubeserve`` command is a table: every subcommand is documented where ``--help`` and the
package docstring list them, and each parses its own options."""

from __future__ import annotations

import re

import pytest

import kubeserve.cli
from kubeserve.cli import COMMANDS, main


def test_every_subcommand_is_listed_in_the_package_docstring() -> None:
    doc = kubeserve.cli.__doc__ or ""
    listed = set(re.findall(r"[a-z][a-z-]+", " ".join(re.findall(r"kubeserve ([a-z| -]+)", doc))))
    assert {command.name for command in COMMANDS} <= listed


def test_subcommand_names_are_unique() -> None:
    names = [command.name for command in COMMANDS]
    assert len(names) == len(set(names))


#: what each subcommand needs besides options
POSITIONALS = {
    "deploy": ["config.yaml"],
    "logs": ["app"],
    "run": ["app:app"],
    "fetch-runtime-env": ["--dest", "d"],
}


@pytest.mark.parametrize("name", sorted(c.name for c in COMMANDS if c.passthrough is None))
def test_an_unknown_flag_is_a_usage_error(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, *POSITIONALS.get(name, []), "--no-such-flag"])
    assert exit_.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
