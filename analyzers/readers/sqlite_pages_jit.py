"""The compiled loops of ``sqlite_pages``: an SQLite table b-tree's pages decoded byte by byte.

Both functions read only inside the buffer they are given, whatever its bytes say: every offset a
page gives is checked against the page before it is read (a damaged file answers a status, never
a read past the buffer). The buffer holds whole pages, ``PAD`` zero bytes after the last.
File format: https://www.sqlite.org/fileformat2.html (b-tree pages, record format).
"""
from __future__ import annotations

import numpy as np
from numba import njit

#: zero bytes after a buffer's last page: a varint read at a page's edge stays inside the buffer
PAD = 32
OK, ODD_PAGE, NOT_INT, OUT_OF_ORDER = 0, 1, 2, 3
LEAF, INTERIOR = 0x0D, 0x05


@njit(cache=True, nogil=True)
def _varint(buf, c):   # pragma: no cover - compiled
    """(value, offset after it) of the varint at ``c`` (1-9 bytes)."""
    v = np.int64(0)
    for k in range(9):
        b = np.int64(buf[c + k])
        if k == 8:
            return (v << 8) | b, c + 9
        v = (v << 7) | (b & 0x7F)
        if b < 0x80:
            return v, c + k + 1
    return v, c + 9


@njit(cache=True, nogil=True)
def interior(buf, off, psz, usable, kids, keys):   # pragma: no cover - compiled
    """An interior table page (its header at ``off``): its children into ``kids`` (the right-most
    last) and cell keys into ``keys``; returns the number of children, or -1 for anything odd."""
    if buf[off] != INTERIOR:
        return -1
    n = (np.int64(buf[off + 3]) << 8) | buf[off + 4]
    if n + 1 > kids.shape[0] or off + 12 + 2 * n > usable:
        return -1
    for i in range(n):
        q = off + 12 + 2 * i
        c = (np.int64(buf[q]) << 8) | buf[q + 1]
        if c < off + 12 + 2 * n or c + 4 > usable:
            return -1
        kids[i] = (np.int64(buf[c]) << 24) | (np.int64(buf[c + 1]) << 16) | (np.int64(buf[c + 2]) << 8) | buf[c + 3]
        keys[i], _ = _varint(buf, c + 4)
    r = off + 8
    kids[n] = (np.int64(buf[r]) << 24) | (np.int64(buf[r + 1]) << 16) | (np.int64(buf[r + 2]) << 8) | buf[r + 3]
    return n + 1


@njit(cache=True, nogil=True)
def leaves(buf, npages, psz, usable, ncol, want, lo, hi, prev, vals, nulls):   # pragma: no cover
    """Rows of the ``npages`` leaf pages in ``buf`` whose rowid is in [lo, hi], their columns
    ``want`` (ascending record indices) into ``vals`` / ``nulls`` (one row of each per wanted
    column; NULL: value 0, null 1).

    Returns (rows written, last rowid seen, status): status ``OK``; ``ODD_PAGE``
    where a page is not a leaf of a table b-tree, a cell does not fit its page, a row spills to
    overflow pages or holds fewer columns than the table; ``NOT_INT`` where a wanted value is a
    float, text or blob; ``OUT_OF_ORDER`` where rowids do not ascend past ``prev``."""
    nw = want.shape[0]
    top = want[nw - 1]
    r = 0
    for p in range(npages):
        base = p * psz
        if buf[base] != LEAF:
            return r, prev, ODD_PAGE
        n = (np.int64(buf[base + 3]) << 8) | buf[base + 4]
        if 8 + 2 * n > usable:
            return r, prev, ODD_PAGE
        for i in range(n):
            q = base + 8 + 2 * i
            c = (np.int64(buf[q]) << 8) | buf[q + 1]
            if c < 8 + 2 * n or c >= usable:
                return r, prev, ODD_PAGE
            plen, c = _varint(buf, base + c)
            rid, c = _varint(buf, c)
            if plen > usable - 35 or c + plen > base + usable:
                return r, prev, ODD_PAGE
            if rid <= prev:
                return r, prev, OUT_OF_ORDER
            prev = rid
            if rid < lo or rid > hi:
                continue
            hs, h = _varint(buf, c)
            if hs > plen or h > c + hs:
                return r, prev, ODD_PAGE
            end = c + plen
            off = c + hs
            j = 0
            for col in range(top + 1):
                if h >= c + hs:
                    return r, prev, ODD_PAGE      # fewer columns than the table: a default
                t = np.int64(buf[h])
                if t < 0x80:
                    h += 1
                else:
                    t, h = _varint(buf, h)
                if t >= 12:
                    sz = (t - 12) >> 1
                elif t == 5:
                    sz = 6
                elif t == 6 or t == 7:
                    sz = 8
                elif t <= 4:
                    sz = t
                elif t <= 9:
                    sz = 0
                else:
                    return r, prev, ODD_PAGE
                if off + sz > end:
                    return r, prev, ODD_PAGE
                if want[j] == col:
                    if t == 7 or t >= 10:
                        return r, prev, NOT_INT
                    v = np.int64(0)
                    if t == 9:
                        v = np.int64(1)
                    elif sz > 0:
                        v = np.int64(np.int8(buf[off]))
                        for k in range(1, sz):
                            v = (v << 8) | np.int64(buf[off + k])
                    vals[j, r] = v
                    nulls[j, r] = 1 if t == 0 else 0
                    j += 1
                off += sz
            r += 1
    return r, prev, OK
