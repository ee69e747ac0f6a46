"""Time and size formatting — the one home for turning integer nanoseconds into text."""
from __future__ import annotations


def fmt_ns(ns: float | int | None, digits: int = 3) -> str:
    """Human time for a duration in ns: ``850 ns``, ``12.4 us``, ``3.21 ms``, ``1.50 s``.

    ``digits`` is the number of significant digits (at least 1); None prints ``-``.
    """
    if ns is None:
        return "-"
    value = float(ns)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if value >= scale:
            return f"{sign}{_sig(value / scale, digits)} {unit}"
    return f"{sign}{value:.0f} ns"


def _sig(x: float, digits: int) -> str:
    digits = max(1, digits)
    if x >= 10 ** digits:
        return f"{x:.0f}"
    whole = len(str(int(x))) if x >= 1 else 1
    return f"{x:.{max(0, digits - whole)}f}"


def fmt_pct(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` (``-`` when whole is 0)."""
    if not whole:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def fmt_bytes(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
