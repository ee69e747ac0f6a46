"""How much of an SQLite file its b-trees reach: a cheap structural check for files too big for a
full ``PRAGMA quick_check`` before every read.

A table whose root was overwritten by one of its leaves reads as that leaf's rows, in rowid order,
with no error: its other pages are simply never reached. Walking every b-tree's interior pages
(about 1 page in 300 of an nsys export) and adding the free list finds such orphaned pages; a page
reached twice is a loop. What is not reached in a sound file: overflow pages (long strings), a
pointer map, the lock-byte page -- a few percent, so only a larger share is suspect, and the caller
then runs the full check, whose answer stands.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np

_MAGIC = b"SQLite format 3\x00"
_LEAVES = (0x0D, 0x0A)          # table leaf, index leaf
_INTERIOR = (0x05, 0x02)        # table interior, index interior
#: a share of the file's pages no b-tree and no free list reaches above this is suspect
UNREACHED_SUSPECT = 0.05


def _children(page: bytes, off: int) -> np.ndarray:
    """Child page numbers of an interior page (header at ``off``): each cell's first 4 bytes and the
    right-most pointer. Cells pointing outside the page are left out (the full check names them)."""
    n = int.from_bytes(page[off + 3:off + 5], "big")
    raw = np.frombuffer(page, np.uint8)
    ptr = np.frombuffer(page, ">u2", min(n, (len(page) - off - 12) // 2), off + 12).astype(np.int64)
    ptr = ptr[ptr + 4 <= len(page)]
    kids = ((raw[ptr].astype(np.int64) << 24) | (raw[ptr + 1].astype(np.int64) << 16)
            | (raw[ptr + 2].astype(np.int64) << 8) | raw[ptr + 3])
    return np.append(kids, int.from_bytes(page[off + 8:off + 12], "big"))


def unreached(path: Path, con: sqlite3.Connection) -> str:
    """What the file's b-trees do not account for, as one phrase for a suspect read; "" when they
    reach all but ``UNREACHED_SUSPECT`` of its pages and no page twice. Reads interior pages only
    (the first page of each level says whether the level is leaves: every leaf is as deep)."""
    roots = sorted({int(r[0]) for r in con.execute(
        "SELECT rootpage FROM sqlite_master WHERE rootpage > 0") if isinstance(r[0], int)})
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 100, 0)
        if len(head) < 100 or head[:16] != _MAGIC:
            return ""
        psz = int.from_bytes(head[16:18], "big")
        psz = 65536 if psz == 1 else psz
        total = os.fstat(fd).st_size // psz
        free = int.from_bytes(head[36:40], "big")
        reached: list[np.ndarray] = [np.array([1], np.int64)]
        interior = 0

        def read(p: int) -> bytes:
            return os.pread(fd, psz, (p - 1) * psz) if 1 <= p <= total else b""

        for root in roots:
            level = np.array([root], np.int64)
            while len(level):
                reached.append(level)
                first = read(int(level[0]))
                if len(first) < psz or first[100 if level[0] == 1 else 0] in _LEAVES:
                    break
                kids = []
                for p in level.tolist():
                    page = read(p)
                    off = 100 if p == 1 else 0
                    if len(page) == psz and page[off] in _INTERIOR:
                        kids.append(_children(page, off))
                interior += len(level)
                if interior > total:
                    return "a b-tree larger than the file"
                level = np.concatenate(kids) if kids else np.zeros(0, np.int64)
    finally:
        os.close(fd)
    pages = np.concatenate(reached)
    pages = pages[(pages >= 1) & (pages <= total)]
    uniq = np.unique(pages)
    if len(uniq) < len(pages):
        return f"{len(pages) - len(uniq)} page(s) reached twice by the b-trees"
    lost = total - len(uniq) - free
    if total and lost > UNREACHED_SUSPECT * total:
        return f"{lost} of {total} pages reached by no b-tree"
    return ""
