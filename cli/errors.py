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


def one_line(message: object) -> str:
    """``message`` on one line: runs of whitespace (newlines included) become one space."""
    return " ".join(str(message).split())


def fail(message: str, code: Exit = Exit.BAD_INPUT) -> NoReturn:
    """Print ``srtscope: error: <message>`` (one line) on stderr and exit with ``code``."""
    print(f"srtscope: error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(int(code))
