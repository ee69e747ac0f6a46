"""numpy's large arrays kept in one region of this process, their pages reused (``_big_blocks.c``).

A trace read in passes frees one pass's big arrays and allocates the next's of other sizes; in the C
heap they land between the small objects every pass leaves, so each pass grew the heap with fresh
pages, and a heap trimmed between passes faulted them in anew: a 10 GB export's first look faulted
~1 M pages (~4 s of system time in this VM). Here arrays of at least ``MIN_BYTES`` come from one
reserved region, first fit with free neighbours merged: once a pass's arrays are gone their blocks
are one free run, and the next pass takes its pages as they are.

``start`` once in the process, then ``use_here`` at the start of each thread that allocates
arrays: numpy's handler is set per context, and a thread starts in a context of its own. The CLI
starts it for a diagnosis in windows only (``cli/streamed.py``; 10 GB export: 0.98 M -> 0.53 M
faults, system time 6.7-7.2 -> 5.2-6.0 s, the same peak RSS). NOTE: not for a whole read, which
keeps its arrays rather than passing them on: there the big arrays apart from the small objects
held more at peak than one heap of both (1 GB export: 1.69-1.76 GB vs 1.54-1.56; best fit instead
of first fit, 1.61 GB, but 2.14 GB at 10 GB in windows). Where the C module was not built, the region
cannot be reserved or ``SRTSCOPE_BIG_BLOCKS=0``, every call is a no-op and numpy allocates as before.
NOTE: the region's free pages are held until ``give_back`` (before a fork: the copy and the caller
each fault in their own); ``spare_bytes`` says how many, which a size chosen from this process's
resident memory counts as free.
"""
from __future__ import annotations

import os
from types import ModuleType


def _module() -> ModuleType | None:
    try:
        from srtscope.analyzers import _big_blocks
    except ImportError:                 # pragma: no cover - built without a C compiler
        return None
    return _big_blocks


_c = _module()

ENV = "SRTSCOPE_BIG_BLOCKS"               # "0": numpy allocates as it would without this module
#: address space reserved (bytes): only what is used is ever backed by memory
RESERVE_BYTES = 1 << 36
MIN_BYTES = _c.MIN_BYTES if _c is not None else 0
_started = False


def start() -> bool:
    """Reserve the region and take numpy's big arrays from it in this thread; False where not."""
    global _started
    if _c is None or os.environ.get(ENV) == "0":
        return False
    if not _started:
        _started = _c.reserve(RESERVE_BYTES)
    return use_here()


def use_here() -> bool:
    """This thread's numpy arrays from the region (after ``start``); False where not."""
    return bool(_started and _c is not None and _c.use())


def give_back() -> int:
    """The free blocks' pages back to the system (bytes given back)."""
    return _c.give_back() if _started and _c is not None else 0


def make_room(nbytes: int) -> int:
    """Before an array of ``nbytes`` that no free run of the region holds (half of it or more would
    be new pages): the free blocks' pages given back first, so that the process does not hold them
    and the new pages at once (bytes given back; 0 where it fits). NOTE: for the one large array of
    a pass (the reduction's joined pieces, ~300 MiB at 10 GB), where whether a free run holds it
    depends on how the windows' blocks fell: it peaked 290 MiB higher when none did."""
    if not _started or _c is None or _c.fresh_bytes(nbytes) < nbytes // 2:
        return 0
    return give_back()


def spare_bytes() -> int:
    """Free bytes in the region whose pages this process holds (resident, reused before new ones)."""
    return _c.stats()[2] if _started and _c is not None else 0
