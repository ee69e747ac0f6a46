"""Types of the C extension built from analyzers/readers/_kineto_fields.c (see there and kineto_columns.py)."""
from typing import Any

def fields(events: list[Any], unset: Any, x: Any, ts: Any, ts_state: Any, dur: Any,
           dur_state: Any) -> tuple[list[Any], list[Any], list[Any], list[Any]]: ...
