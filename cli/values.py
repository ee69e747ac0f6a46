"""Bounds for the CLI's numeric options: finite, in range, with a stated maximum.

``check_*`` raise ValueError (the library edge); ``*_option`` callbacks turn that into click's
BadParameter, which the app prints as one line with exit 2.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import typer

MAX_THRESHOLD_US = 1e9          # --threshold-us: 1000 s; a bubble longer than that is no bubble
MAX_REGRESSION_PCT = 1e6        # --fail-on-regression: percent


def check_float(name: str, value: float, lo: float, hi: float, unit: str = "") -> float:
    """``value`` if it is finite and within [lo, hi]; else ValueError naming ``name``."""
    u = f" {unit}" if unit else ""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be in {lo:g}..{hi:g}{u}, got {value:g}{u}")
    return float(value)


def check_int(name: str, value: int, lo: int, hi: int, unit: str = "") -> int:
    """``value`` if it is an int within [lo, hi]; else ValueError naming ``name``."""
    u = f" {unit}" if unit else ""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if not lo <= value <= hi:
        shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:10]}...({len(str(value))} digits)"
        raise ValueError(f"{name}: must be in {lo}..{hi}{u}, got {shown}{u}")
    return value


def float_option(lo: float, hi: float, unit: str = "") -> Callable[[float | None], float | None]:
    """A typer callback: None passes; anything else must be finite and within [lo, hi]."""
    def callback(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None:
            return None
        try:
            return check_float(param.opts[0] if param.opts else str(param.name), value, lo, hi, unit)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).split(": ", 1)[-1]) from None

    return callback  # type: ignore[return-value]
