"""``TraceError``: the one error readers raise for input they cannot read."""
from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read. The message is one line: ``"<path>: <what is wrong>"``."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = str(path)
        self.what = " ".join(str(what).split())  # one line, whatever the cause said
        super().__init__(f"{self.path}: {self.what}")

    def __reduce__(self) -> tuple:
        return (TraceError, (self.path, self.what))   # crosses process boundaries (--jobs)
