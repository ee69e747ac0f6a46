"""Types of the C extension built from analyzers/readers/_sqlite_pages.c (see there and sqlite_pages.py)."""
from typing import Any

PAD: int
OK: int
ODD_PAGE: int
NOT_INT: int
OUT_OF_ORDER: int
LEAF: int
INTERIOR: int

def leaves(buf: Any, at: Any, low: Any, high: Any, psz: int, usable: int, want: Any, lo: int, hi: int, prev: int,
           vals: Any, nulls: Any, cap: int) -> tuple[int, int, int]: ...
def interior(page: Any, off: int, psz: int, usable: int, kids: Any, keys: Any) -> int: ...
