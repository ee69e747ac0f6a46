"""Diff of two diagnoses: the same figures side by side, the change in each, and CI regressions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from srtscope.analyzers.results import BUBBLE_CLASSES

if TYPE_CHECKING:
    from srtscope.analyzers.results import Diagnosis

Better = Literal["lower", "higher", "neutral"]

#: (figure name, path in Diagnosis.to_json(), which direction is better)
FIGURES: tuple[tuple[str, tuple[str, ...], Better], ...] = (
    ("device_busy_ns", ("bubbles", "busy_ns"), "neutral"),
    ("window_ns", ("bubbles", "window_ns"), "neutral"),
    ("bubbles.count", ("bubbles", "count"), "lower"),
    ("bubbles.total_ns", ("bubbles", "total_ns"), "lower"),
    *((f"bubbles.by_class.{c}_ns", ("bubbles", "by_class", c), "lower") for c in BUBBLE_CLASSES),
    ("steps.count", ("steps", "count"), "neutral"),
    ("steps.graph", ("steps", "graph"), "neutral"),
    ("steps.eager", ("steps", "eager"), "lower"),
    ("eager.extra_ns", ("eager", "extra_ns"), "lower"),
    ("comm.total_ns", ("comm", "total_ns"), "lower"),
    ("comm.exposed_ns", ("comm", "exposed_ns"), "lower"),
    ("comm.skew_ns", ("comm", "skew_ns"), "lower"),
    ("budget.mean_step.wall_ns", ("budget", "mean_step", "wall_ns"), "lower"),
    ("budget.mean_step.compute_ns", ("budget", "mean_step", "compute_ns"), "neutral"),
    ("budget.mean_step.bubbles_ns", ("budget", "mean_step", "bubbles_ns"), "lower"),
)


@dataclass(frozen=True)
class FigureDelta:
    name: str
    before: float | int
    after: float | int
    better: Better

    @property
    def delta(self) -> float | int:
        return self.after - self.before

    @property
    def pct(self) -> float | None:
        """Change in percent of ``before``; None when before is 0."""
        return None if self.before == 0 else 100.0 * (self.after - self.before) / abs(self.before)

    def worse_by(self, pct: float) -> bool:
        """True when the figure moved the wrong way by more than ``pct`` percent."""
        if self.better == "neutral" or self.delta == 0:
            return False
        wrong = self.delta > 0 if self.better == "lower" else self.delta < 0
        if not wrong:
            return False
        return self.pct is None or abs(self.pct) > pct

    @property
    def worse(self) -> bool:
        """Moved the wrong way (by any amount)."""
        return self.worse_by(0.0)

    def to_json(self) -> dict[str, Any]:
        p = self.pct
        return {"figure": self.name, "before": self.before, "after": self.after, "delta": self.delta,
                "delta_pct": None if p is None else round(p, 2), "better": self.better,
                "worse": self.worse}


@dataclass(frozen=True)
class DiagnosisDiff:
    before_bottleneck: str
    after_bottleneck: str
    figures: tuple[FigureDelta, ...]

    def figure(self, name: str) -> FigureDelta:
        for f in self.figures:
            if f.name == name:
                return f
        raise KeyError(f"no figure {name!r}; known: {', '.join(f.name for f in self.figures)}")

    def regressions(self, pct: float) -> list[FigureDelta]:
        """Figures that got worse by more than ``pct`` percent (a CI gate fails when non-empty)."""
        if pct < 0:
            raise ValueError(f"regression threshold must be >= 0 %, got {pct}")
        return [f for f in self.figures if f.worse_by(pct)]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": {"before": self.before_bottleneck, "after": self.after_bottleneck,
                            "changed": self.before_bottleneck != self.after_bottleneck},
                "figures": [f.to_json() for f in self.figures]}


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> float | int:
    v: Any = doc
    for k in path:
        v = v.get(k, 0) if isinstance(v, dict) else 0
    return v if isinstance(v, (int, float)) and v is not None else 0


def compare(before: Diagnosis, after: Diagnosis) -> DiagnosisDiff:
    """The figures of ``FIGURES`` for both diagnoses, side by side."""
    b, a = before.to_json(), after.to_json()
    figs = tuple(FigureDelta(name, _get(b, path), _get(a, path), better) for name, path, better in FIGURES)
    return DiagnosisDiff(b["verdict"]["bottleneck"], a["verdict"]["bottleneck"], figs)
