"""The C heap tuned for a read's big arrays: freed pages kept for the next window's arrays.

glibc gives each allocation over its mmap threshold (at most 32 MiB by default) fresh pages from
the kernel and returns them on free: every window of a bounded read then faults in its column
arrays anew (page faults and zeroing: ~10% of a 3 GB read's CPU). Raising the mmap and trim
thresholds keeps those pages in the heap, where the next window's arrays of the same sizes reuse
them. What is resident never exceeds the read's own peak: only freed memory is kept, for reuse.

Set once per process by the command line (``cli/app.main``), never by the library: it is a
process-wide setting. ``SRTSCOPE_KEEP_HEAP=0`` leaves glibc's defaults.
"""
from __future__ import annotations

import ctypes
import os

ENV = "SRTSCOPE_KEEP_HEAP"
#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: allocations up to this come from the heap and freed memory up to this stays in it (bytes)
KEEP_BYTES = 1 << 30


def keep_freed_pages() -> bool:
    """Raise glibc's mmap and trim thresholds to ``KEEP_BYTES``; False where not done (another C
    library, or ``ENV`` is 0)."""
    if os.environ.get(ENV, "") == "0":
        return False
    # NOTE: the process's own symbols (glibc is loaded): ``ctypes.util.find_library`` would run
    # ``ldconfig`` or a compiler at every start of the command line
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
