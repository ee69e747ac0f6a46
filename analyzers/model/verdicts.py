"""Typed results of the verdict: the ``Verdict`` with its findings and advice, and the what-ifs.

Each ``to_json()`` is its part of the ``srtscope diagnose --json`` contract (docs/json_contract.md):
every time an integer number of nanoseconds, fractions as floats in 0..1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from srtscope.analyzers.model.vocab import Bottleneck as BottleneckClass
from srtscope.analyzers.model.vocab import Cause

Bottleneck = Literal["scheduler", "prep", "kernel", "host"]
BOTTLENECKS: tuple[str, ...] = tuple(b.value for b in BottleneckClass)
CAUSES: tuple[str, ...] = tuple(c.value for c in Cause)


def _ns(x: Any) -> int:
    return int(x)


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: a figure with its meaning (``unit``: ns, pct, count or '')."""

    kind: str
    text: str
    value: float | int | None = None
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        v = self.value
        if v is not None:
            v = int(v) if self.unit in ("ns", "count") else round(float(v), 4)
        return {"kind": self.kind, "text": self.text, "value": v, "unit": self.unit}


@dataclass(frozen=True)
class Advice:
    """One concrete next step, for one cause."""

    cause: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "text": self.text}


@dataclass(frozen=True)
class Verdict:
    bottleneck: Bottleneck
    confidence: float                 # 0..1
    summary: str
    evidence: tuple[Finding, ...] = ()
    caveats: tuple[str, ...] = ()
    healthy: bool = False
    scores_ns: dict[str, int] = field(default_factory=dict)   # lost time blamed on each bottleneck
    cause: str = Cause.COMPUTE.value                          # the cause beneath the bottleneck
    causes_ns: dict[str, int] = field(default_factory=dict)   # lost time per cause
    advice: tuple[Advice, ...] = ()
    #: the report's first two lines and the line under them: the cause's one figure ("66% of lost
    #: time"), what fixing it gives (its what-if), the other causes with their figures
    headline: str = ""
    gain: str = ""
    alternatives: str = ""

    def __post_init__(self) -> None:
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"bottleneck must be one of {BOTTLENECKS}, got {self.bottleneck!r}")
        if self.cause not in CAUSES:
            raise ValueError(f"cause must be one of {CAUSES}, got {self.cause!r}")
        if Cause(self.cause).bottleneck.value != self.bottleneck:
            raise ValueError(f"cause {self.cause!r} does not belong to bottleneck {self.bottleneck!r}")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence must be in 0..1, got {self.confidence}")

    def to_json(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "cause": self.cause,
                "confidence": round(float(self.confidence), 3),
                "summary": self.summary, "headline": self.headline, "gain": self.gain,
                "alternatives": self.alternatives, "healthy": self.healthy,
                "scores_ns": {k: _ns(v) for k, v in self.scores_ns.items()},
                "causes_ns": {k: _ns(v) for k, v in self.causes_ns.items()},
                "evidence": [f.to_json() for f in self.evidence], "caveats": list(self.caveats),
                "advice": [a.to_json() for a in self.advice]}


@dataclass(frozen=True)
class WhatIf:
    """One cause removed (or shrunk): the predicted mean step wall time, ns, and what that assumes.

    ``saved_ns`` is per mean step (summed saving over the steps / the number of steps, warm-up steps
    left out); ``step_ns_after = step_ns_before - saved_ns``; ``steps``: how many steps gain anything.
    """

    cause: str                            # a vocab.Cause value
    cls: str                              # its bottleneck class (vocab.Bottleneck value)
    saved_ns: int
    step_ns_before: int
    step_ns_after: int
    steps: int
    assumptions: tuple[str, ...] = ()
    #: per step (rows of the step table, in order): ns saved — for scripts; not in the JSON
    per_step_ns: Any = field(default=None, compare=False, repr=False)
    lost_ns: int = 0                      # what the cause lost per mean step (the same steps): saved_ns <= it
    bound: str = "none"                   # a vocab.WhatIfBound value: what limited saved_ns
    predicted: bool = True                # False: too little device work to predict (saved_ns 0)
    warmup_steps: int = 0                 # leading warm-up steps left out of the means

    @property
    def speedup(self) -> float:
        """End-to-end step speedup, before / after (1.0 when nothing changes)."""
        return self.step_ns_before / self.step_ns_after if self.step_ns_after > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "class": self.cls, "saved_ns": _ns(self.saved_ns),
                "step_ns_before": _ns(self.step_ns_before), "step_ns_after": _ns(self.step_ns_after),
                "speedup": round(self.speedup, 4), "steps": int(self.steps),
                "lost_ns": _ns(self.lost_ns), "bound": self.bound, "predicted": bool(self.predicted),
                "warmup_steps": int(self.warmup_steps), "assumptions": list(self.assumptions)}
