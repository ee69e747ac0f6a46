"""Microsecond literals of a Kineto trace (the raw JSON text of ``ts`` / ``dur``) -> integer ns, in bulk.

    ns, ok = literals_ns([b"1700000000000117.250", b"12", b"4.07"])   # int64 ns, bool

The same integers ``jsonstream.us_to_ns`` gives the value the streaming parser decodes from each
literal (``parse_float``: a float literal of over 15 characters stays an exact decimal string):

- an int literal (whole part at most 16 digits, ns within int64): ``v * 1000``;
- a float literal of at most 15 characters: ``round(float(s) * 1000)`` (half to even); its digits,
  at most 14, are an exact double ``D``, and ``D / 10**k`` is the correctly rounded ``float(s)``;
- a longer float literal (epoch µs with ns decimals): exact, ``whole * 1000`` plus the first three
  decimals, plus one when the fourth is 5 or more.

Anything else (a string, an exponent, a sign, a literal over ``MAX_CHARS``, a whole part over 16
digits or whose ns pass int64) is not converted here: ``ok`` is False there and the caller decodes that literal itself.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: the longest literal converted in bulk (an epoch µs with 3 to 6 decimals has 20 to 23)
MAX_CHARS = 24
_SEP = ord(",")
_DOT = ord(".")
_ZERO = ord("0")
#: the largest whole part whose ns (with 1000 ns of decimals) fits int64
_MAX_WHOLE = np.iinfo(np.int64).max // 1000 - 1
_POW10 = np.array([10.0 ** k for k in range(16)])


def literals_ns(raws: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(int64 ns, bool ok) of each raw literal (bytes-like, no comma in it; ``b""`` for none)."""
    n = len(raws)
    ns = np.zeros(n, np.int64)
    if not n:
        return ns, np.zeros(0, bool)
    text = np.frombuffer(b",".join(raws), np.uint8)
    seps = np.flatnonzero(text == _SEP)
    if len(seps) != n - 1 or not len(text):   # a comma in a literal (a string); none: one at a time
        return ns, np.zeros(n, bool)
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = seps + 1
    ends = np.empty(n, np.int64)
    ends[:-1] = seps
    ends[-1] = len(text)
    lens = ends - starts
    ok = (lens > 0) & (lens <= MAX_CHARS)
    width = int(lens[ok].max()) if ok.any() else 1
    cols = np.arange(width)
    idx = starts[:, None] + cols[None, :]
    inside = cols[None, :] < lens[:, None]
    chars = np.where(inside, text[np.minimum(idx, len(text) - 1)], 0).astype(np.int16)
    digit = (chars >= _ZERO) & (chars <= _ZERO + 9)
    dot = chars == _DOT
    n_dots = dot.sum(axis=1)
    ok &= ((digit | dot) == inside).all(axis=1) & (n_dots <= 1) & digit[:, 0]
    # where the dot is (the length when there is none), digits after it
    at = np.where(n_dots == 1, np.argmax(dot, axis=1), lens)
    ok &= ~((n_dots == 1) & (at == lens - 1))           # "12." is no JSON number
    ok &= at <= 16                                      # whole part in int64 (bounded below)
    d = np.where(digit, chars - _ZERO, 0).astype(np.int64)
    whole = np.zeros(n, np.int64)
    frac3 = np.zeros(n, np.int64)
    every = np.zeros(n, np.int64)                       # all digits, the dot skipped (short floats)
    up = np.zeros(n, bool)
    for j in range(width):
        dj = d[:, j]
        before = j < at
        whole = np.where(before, whole * 10 + dj, whole)
        q = j - at - 1                                  # index among the decimals
        frac3 += np.where((q >= 0) & (q < 3), dj * np.array([100, 10, 1])[np.clip(q, 0, 2)], 0)
        up |= (q == 3) & (dj >= 5)
        every = np.where(digit[:, j] & (j < 16), every * 10 + dj, every)
    ok &= whole <= _MAX_WHOLE
    is_float = n_dots == 1
    short = is_float & (lens <= 15)
    ns = np.where(is_float, whole * 1000 + frac3 + up, whole * 1000)
    if short.any():
        k = (lens - at - 1)[short]
        val = every[short].astype(np.float64) / _POW10[k]
        ns[short] = np.rint(val * 1000.0).astype(np.int64)
    ns[~ok] = 0
    return ns, ok
