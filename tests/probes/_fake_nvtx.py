"""A stand-in for the ``nvtx`` package's domain with a collector attached (as under nsys): it
records the pushes and pops a live domain would receive."""
from __future__ import annotations

import sys
import types


class _Handle:
    def __init__(self, live: bool) -> None:
        self.live = live

    def enabled(self) -> bool:
        return self.live


class FakeDomain:
    def __init__(self, live: bool = True) -> None:
        self.handle = _Handle(live)
        self.calls: list[tuple[str, str | None]] = []

    def get_event_attributes(self, message: str | None = None) -> str | None:
        return message

    def push_range(self, attributes: str | None = None) -> None:
        self.calls.append(("push", attributes))

    def pop_range(self) -> None:
        self.calls.append(("pop", None))


def install(monkeypatch, live: bool = True) -> FakeDomain:
    """Make ``import nvtx`` give a module whose ``get_domain`` returns one FakeDomain."""
    domain = FakeDomain(live)
    mod = types.ModuleType("nvtx")
    mod.get_domain = lambda name: domain  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    return domain
