"""``--memory-budget SIZE``: the most memory a diagnosis may take (the read that keeps to it:
``analyzers/traces.py``).

SIZE: ``2GiB``, ``1500MB``, ``800M``, ``4g`` (binary units for ``K``/``M``/``G``/``T`` with or without
``iB``; decimal for ``kB``/``MB``/``GB``/``TB``; plain bytes), ``none`` (no limit) or ``auto`` (the
default: ``AUTO_SHARE`` of ``MemAvailable`` in ``/proc/meminfo``, at least 1 GiB; no limit where
there is no such file).
Before reading, each file's peak is estimated (``readers/memory_estimate.py``); over the budget, an
nsys export is diagnosed in windows, or read by time window (``analyzers/pipeline/memory_plan.py``), and
anything else refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import typer

#: ``auto``: this share of the memory the system says is available now, at least ``AUTO_FLOOR``
#: (below it the budget would refuse small traces on a busy machine rather than protect it)
AUTO_SHARE = 0.7
AUTO_FLOOR = 1 << 30
#: the smallest budget taken: below it not even the interpreter with its libraries fits
MIN_BUDGET = 64 << 20
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
          "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
HELP = ("The most memory the diagnosis may take: 2GiB, 1500MB, 800M; 'none' for no limit; 'auto' "
        "(default): 70% of the available memory, at least 1GiB. Over it, an nsys export is diagnosed over a window of "
        "whole steps in the middle of the capture (a window_cut warning says which); other traces are "
        "refused.")


@dataclass(frozen=True)
class Budget:
    """``bytes``: the limit (None: none); ``text``: what the user gave (for messages)."""

    bytes: int | None
    text: str


def mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where there is no such file or line."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def parse_budget(text: str | None) -> Budget:
    """``--memory-budget``'s value; ValueError with the reason for anything else."""
    t = "auto" if text is None else text.strip()
    if t.lower() == "none":
        return Budget(None, "none")
    if t.lower() == "auto":
        avail = mem_available()
        return Budget(None if avail is None else max(AUTO_FLOOR, int(avail * AUTO_SHARE)), "auto")
    m = _SIZE.fullmatch(t)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r}: expected a size such as 2GiB, 1500MB or 800M, or none, or auto")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if n < MIN_BUDGET:
        raise ValueError(f"{text!r}: at least 64MiB (the program alone takes more)")
    if n > 1 << 60:
        raise ValueError(f"{text!r}: at most 1EiB")
    return Budget(int(n), t)


def budget_option(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str:
    """A typer callback: ``--memory-budget`` as given, checked (``parse_budget``: bad values exit 2
    with one line); parsed where it is used (``auto`` reads the memory available then)."""
    try:
        parse_budget(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return "auto" if value is None else value

