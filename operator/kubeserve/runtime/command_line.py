"""The argument parser of the data plane's commands (the proxy, the replica).

:class:`argparse.HelpFormatter` imports :mod:`shutil` (and with it zlib, bz2 and lzma, ~0.5 MB
of resident memory) to learn the terminal's width, and ``ArgumentParser`` makes one for every
argument it is given, help or not. A proxy or replica process never prints help to a terminal
but would carry those modules for its whole life; this formatter reads the width as
:func:`shutil.get_terminal_size` does (``COLUMNS``, then the terminal of stdout, else 80),
without them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["argument_parser"]


def _columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)


def argument_parser(**options: Any) -> argparse.ArgumentParser:
    """An :class:`argparse.ArgumentParser` of ``options`` whose help needs no :mod:`shutil`."""
    return argparse.ArgumentParser(formatter_class=_Formatter, **options)
