"""One integer column of a spool segment (``time_spool``) stored in the fewest bytes its values need.

``pack`` keeps a column of one value over the segment as that value only; otherwise its values less
the segment's lowest, or each row's step from the row before less the lowest step (starts and
correlation ids climb by small steps in arrival order; a step of one value takes no bytes), in 1,
2 or 4 bytes, whichever is fewer. ``decode`` gives a stored column back exactly, with ``end_ns``
stored as the duration ``end_ns - start_ns`` (``Col.dur``).
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

_WIDTHS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32))


@dataclass(frozen=True)
class Col:
    """One column of a segment: ``dtype`` as added; each row is ``base`` plus its stored value
    (``stored``: their type; None: every row is ``base``), at byte ``at`` of the segment; ``dur``:
    the row's ``start_ns`` added too (``end_ns`` stored as a duration). ``steps``: the first row is
    ``base``, each next one the row before plus ``step`` plus its stored value (one fewer stored
    than rows; None stored: every step is ``step``)."""
    name: str
    dtype: np.dtype
    base: int
    stored: np.dtype | None
    at: int = 0
    dur: bool = False
    steps: bool = False
    step: int = 0


class Packed(NamedTuple):
    """A column as ``pack`` stores it (``Col`` says the same of a stored one)."""

    base: int
    stored: np.dtype | None
    values: np.ndarray | None
    steps: bool = False
    step: int = 0


def narrowest(span: int) -> np.dtype | None:
    """The narrowest unsigned type holding 0..``span``; None past 32 bits."""
    return next((t for t in _WIDTHS if span <= np.iinfo(t).max), None)


def pack(a: np.ndarray) -> Packed:
    """An integer column as stored: its one value (nothing stored), or its values less the lowest,
    or (from the second row on) its steps less the lowest step, in the narrowest unsigned type that
    holds them, whichever takes fewer bytes and fewer than the column's own; else as it is."""
    lo, hi = int(a.min()), int(a.max())
    if lo == hi:
        return Packed(lo, None, None)
    own = a.dtype.itemsize
    t = narrowest(hi - lo)
    size = t.itemsize if t is not None and t.itemsize < own else own
    if len(a) > 2 and (a.dtype.kind == "i" or own <= 4):
        # NOTE: an int64's steps may wrap: modulo 2**64 they still add up to each value exactly
        d = np.diff(a.astype(np.int64, copy=False))
        dlo, dhi = int(d.min()), int(d.max())
        if dlo == dhi:
            return Packed(int(a[0]), None, None, True, dlo)
        dt = narrowest(dhi - dlo)
        if dt is not None and dt.itemsize < size:
            return Packed(int(a[0]), dt, (d - np.int64(dlo)).astype(dt), True, dlo)
    if size < own and t is not None:
        # NOTE: exact also where an int32's difference wraps: modulo 2**32 it is the offset
        return Packed(lo, t, (a - a.dtype.type(lo)).astype(t))
    return Packed(0, a.dtype, a)


def decode(c: Col, view: mmap.mmap | None, dst: np.ndarray, start: np.ndarray) -> None:
    """``dst`` filled with the values of stored column ``c`` (its bytes in ``view``; ``start``: the
    segment's decoded ``start_ns``, for a duration)."""
    if c.steps:
        _unstep(c, view, dst)
    elif c.stored is None:
        dst.fill(c.base)
    else:
        vals = np.frombuffer(view, c.stored, len(dst), c.at)   # type: ignore[arg-type]
        if c.base:
            np.add(vals, np.asarray(c.base, c.dtype), out=dst, casting="unsafe")
        else:
            np.copyto(dst, vals, casting="unsafe")
    if c.dur:
        dst += start


def _unstep(c: Col, view: mmap.mmap | None, dst: np.ndarray) -> None:
    """``dst`` filled with the values of a column stored as steps (``_Col.steps``)."""
    np.copyto(dst[:1], np.int64(c.base) if c.base < 2**63 else np.uint64(c.base), casting="unsafe")
    if len(dst) > 1:
        if c.stored is None:
            np.copyto(dst[1:], np.int64(c.step), casting="unsafe")
        else:
            steps = np.frombuffer(view, c.stored, len(dst) - 1, c.at)     # type: ignore[arg-type]
            np.add(steps, np.int64(c.step), out=dst[1:], casting="unsafe")
        np.cumsum(dst, out=dst, dtype=dst.dtype)    # wraps as the steps did: each value exact
