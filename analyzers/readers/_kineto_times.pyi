"""Types of the C extension built from analyzers/readers/_kineto_times.c (see there and kineto_times.py)."""
from typing import Any

def literals_ns(raws: list[Any], ns: Any, ok: Any) -> int: ...
