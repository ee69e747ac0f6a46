"""Exit codes and the one-line error path: user errors never print a traceback."""
from __future__ import annotations

import sys
from enum import IntEnum
from typing import NoReturn

import typer


class Exit(IntEnum):
    OK = 0
    INTERNAL = 1
    BAD_INPUT = 2
    REGRESSION = 3


def fail(message: str, code: Exit = Exit.BAD_INPUT) -> NoReturn:
    """Print ``srtscope: error: <message>`` (one line) on stderr and exit with ``code``."""
    one_line = " ".join(str(message).split())
    print(f"srtscope: error: {one_line}", file=sys.stderr)
    raise typer.Exit(int(code))
