"""Formatting — the one home for turning integer nanoseconds, and names from traces, into text."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(text: object, limit: int = 4096) -> str:
    """A name or message from a trace made safe to print: control characters (escape sequences)
    removed, unencodable code points (lone surrogates) replaced, at most ``limit`` characters.
    NOTE: clipped before anything else, so the cost never grows with the string's length."""
    s = str(text)[: limit + 1]
    s = s.encode("utf-8", errors="replace").decode("utf-8", errors="replace")
    s = _CONTROL.sub("", s.replace("\t", " ").replace("\n", " "))
    return clip_text(s, limit)


#: the longest string a diagnosis document holds (names from traces are cut to it, keeping their end)
MAX_TEXT_CHARS = 4096
KEEP_END_CHARS = 64
#: the longest name a reader keeps (kernel, range, thread): a longer one is cut, keeping its last
#: ``NAME_END_CHARS``, so that a huge name costs no more than this (a 300 MB one took 1.9 GB)
MAX_NAME_CHARS = 16384
NAME_END_CHARS = 64


def name_text(v: object) -> str:
    """A name from a trace as the readers keep it: ``str(v)``, cut to ``MAX_NAME_CHARS``."""
    s = v if isinstance(v, str) else str(v)
    return s if len(s) <= MAX_NAME_CHARS else clip_text(s, MAX_NAME_CHARS, NAME_END_CHARS)


def bound_strings(node: object, limit: int = MAX_TEXT_CHARS) -> object:
    """``node`` (JSON-like: dicts, lists, scalars) with every string, keys included, at most
    ``limit`` characters (``clip_text``, keeping the last ``KEEP_END_CHARS``); the rest as is."""
    if isinstance(node, str):
        return clip_text(node, limit, KEEP_END_CHARS) if len(node) > limit else node
    if isinstance(node, dict):
        return {bound_strings(k, limit): bound_strings(v, limit) for k, v in node.items()}
    if isinstance(node, list):
        return [bound_strings(v, limit) for v in node]
    return node


def clip_text(text: str, width: int, keep_end: int = 0) -> str:
    """``text`` in at most ``width`` characters, with ``…`` where it was cut; ``keep_end`` keeps
    that many characters of the end (the part of a kernel name that tells instances apart)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    keep_end = min(keep_end, width - 2)
    head = width - 1 - keep_end
    return text[:head] + "…" + (text[-keep_end:] if keep_end else "")


def fmt_ns(ns: float | int | None, digits: int = 3) -> str:
    """Human time for a duration in ns: ``850 ns``, ``12.4 us``, ``3.21 ms``, ``1.50 s``.

    ``digits`` is the number of significant digits (at least 1); None prints ``-``.
    """
    if ns is None:
        return "-"
    value = float(ns)
    sign = "-" if value < 0 else ""
    value = abs(value)
    units = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))
    for i, (unit, scale) in enumerate(units):
        if value >= scale or unit == "ns":
            text = _sig(value / scale, digits) if unit != "ns" else f"{value:.0f}"
            # NOTE: rounding can carry into the next unit (999.96 us -> "1000 us" -> "1.00 ms")
            if i > 0 and float(text) >= 1000:
                up, up_scale = units[i - 1]
                return f"{sign}{_sig(value / up_scale, digits)} {up}"
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable")


def _sig(x: float, digits: int) -> str:
    digits = max(1, digits)
    if x >= 10 ** digits:
        return f"{x:.0f}"
    whole = len(str(int(x))) if x >= 1 else 1
    dec = max(0, digits - whole)
    text = f"{x:.{dec}f}"
    if dec and len(text.split(".")[0]) > whole:  # rounding carried a digit: 99.96 -> 100.0
        text = f"{x:.{dec - 1}f}"
    return text


def fmt_bytes(n: float | int | None) -> str:
    """Human size, decimal units scaled to the value: ``512 B``, ``3.4 kB``, ``12.0 MB``, ``1.2 GB``;
    None or a negative count (unknown) prints ``?``."""
    if n is None or n < 0:
        return "?"
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


def fmt_pct(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` (``-`` when whole is 0)."""
    if not whole:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def fmt_mem(n: float | int) -> str:
    """A memory size in binary units, as ``--memory-budget`` takes them: ``512 MiB``, ``9.1 GiB``."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{max(0, n) / (1 << 20):.0f} MiB"


def plural(n: int, word: str, many: str = "") -> str:
    """``n`` and ``word`` agreeing: ``1 step``, ``2 steps``, ``0 steps`` (``many``: an irregular
    plural, e.g. ``entries``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
