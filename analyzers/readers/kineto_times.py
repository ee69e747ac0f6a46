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

try:
    from srtscope.analyzers.readers import _kineto_times as _C
except ImportError:         # not built (optional in setup.py): numpy does it, ~10x slower
    _C = None  # type: ignore[assignment]

#: the longest literal converted in bulk (an epoch µs with 3 to 6 decimals has 20 to 23)
MAX_CHARS = 24
_DOT = ord(".")
_ZERO = ord("0")
#: the largest whole part whose ns (with 1000 ns of decimals) fits int64
_MAX_WHOLE = np.iinfo(np.int64).max // 1000 - 1
_POW10 = np.array([10.0 ** k for k in range(16)])
_POW10_INT = np.array([10 ** k for k in range(17)], np.int64)


def literals_ns(raws: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(int64 ns, bool ok) of each raw literal (bytes-like; anything else is not ok): the C
    extension's (``_kineto_times.c``, ~20 ns a literal) where it was built, else ``literals_ns_numpy``."""
    if _C is not None:
        n = len(raws)
        ns = np.empty(n, np.int64)
        ok = np.empty(n, np.uint8)
        _C.literals_ns(raws if isinstance(raws, list) else list(raws), ns, ok)
        return ns, ok.view(bool)
    return literals_ns_numpy(raws)


def literals_ns_numpy(raws: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``literals_ns`` in numpy: (int64 ns, bool ok) of each raw literal (bytes-like, no comma in it;
    ``b""`` for none)."""
    n = len(raws)
    ns = np.zeros(n, np.int64)
    ok = np.zeros(n, bool)
    if not n:
        return ns, ok
    parts = b",".join(raws).split(b",")
    if len(parts) != n:                 # a comma inside a literal (a string): one at a time
        return ns, ok
    lens = np.fromiter(map(len, parts), np.int64, n)
    chars = np.array(parts, dtype=f"S{MAX_CHARS}").view(np.uint8).reshape(n, MAX_CHARS)
    width = max(1, int(min(MAX_CHARS, lens.max())))
    chars = chars[:, :width]
    inside = np.arange(width)[None, :] < lens[:, None]
    dot = chars == _DOT
    digit = (chars - np.uint8(_ZERO)) <= 9
    n_dots = dot.sum(axis=1)
    good = ((digit | dot) == inside).all(axis=1) & (n_dots <= 1) & digit[:, 0] & (lens <= MAX_CHARS)
    at = np.where(n_dots == 1, np.argmax(dot, axis=1), lens)          # the dot, or the end
    good &= (at < lens - 1) | (n_dots == 0)                           # "12." is no JSON number
    good &= at <= 16
    # the literals of one shape (length, dot) have their digits in the same columns: a few shapes
    shape = np.where(good, lens * 32 + at, -1)
    kinds, inverse = np.unique(shape, return_inverse=True)
    digits = chars - np.uint8(_ZERO)
    for k, key in enumerate(kinds.tolist()):
        if key < 0:
            continue
        rows = np.flatnonzero(inverse == k)
        length, pos = divmod(key, 32)
        d = digits[rows, :length].astype(np.int64)
        whole = d[:, :pos] @ _POW10_INT[pos - 1::-1] if pos else np.zeros(len(rows), np.int64)
        fits = whole <= _MAX_WHOLE
        if pos == length:                                             # an int
            v = whole * 1000
        elif length <= 15:                                            # a short float: float(s)
            every = np.concatenate([d[:, :pos], d[:, pos + 1:]], axis=1)
            val = (every @ _POW10_INT[length - 2::-1]).astype(np.float64) / _POW10[length - 1 - pos]
            v = np.rint(val * 1000.0).astype(np.int64)
        else:                                                         # exact decimals
            dec = d[:, pos + 1:pos + 4]
            v = whole * 1000 + dec @ np.array([100, 10, 1][:dec.shape[1]], np.int64)
            if length > pos + 4:
                v += d[:, pos + 4] >= 5
        ns[rows] = np.where(fits, v, 0)
        ok[rows] = fits
    return ns, ok
