"""Diff of two diagnoses: the same figures side by side, the change in each, and CI regressions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from srtscope.analyzers.vocab import BUBBLE_CLASSES

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
    ("bubbles.sub_threshold_ns", ("bubbles", "sub_threshold_ns"), "lower"),
    ("device.memcpy_ns", ("device", "memcpy_ns"), "neutral"),
    ("device.exposed_memcpy_ns", ("device", "exposed_memcpy_ns"), "lower"),
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
    warnings: tuple[str, ...] = ()       # why the two captures may not be comparable
    before_cause: str = ""
    after_cause: str = ""

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
                            "changed": self.before_bottleneck != self.after_bottleneck,
                            "before_cause": self.before_cause, "after_cause": self.after_cause},
                "figures": [f.to_json() for f in self.figures], "warnings": list(self.warnings)}


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> float | int:
    v: Any = doc
    for k in path:
        v = v.get(k, 0) if isinstance(v, dict) else 0
    return v if isinstance(v, (int, float)) and v is not None else 0


def compare(before: Diagnosis, after: Diagnosis) -> DiagnosisDiff:
    """The figures of ``FIGURES`` for both diagnoses, side by side."""
    b, a = before.to_json(), after.to_json()
    figs = tuple(FigureDelta(name, _get(b, path), _get(a, path), better) for name, path, better in FIGURES)
    return DiagnosisDiff(b["verdict"]["bottleneck"], a["verdict"]["bottleneck"], figs, comparability(b, a),
                         str(b["verdict"].get("cause", "")), str(a["verdict"].get("cause", "")))


def comparability(b: dict[str, Any], a: dict[str, Any]) -> tuple[str, ...]:
    """Reasons the two captures may not measure the same thing: other GPUs, other formats, other
    ranks, step counts or kernel mixes far apart."""
    out = []

    def gpus(d: dict[str, Any]) -> list[str]:
        return sorted({str(x.get("name") or "") for x in (d.get("capture") or {}).get("devices") or []} - {""})

    if gpus(b) and gpus(a) and gpus(b) != gpus(a):
        out.append(f"different devices: {', '.join(gpus(b))} vs {', '.join(gpus(a))}")
    fb, fa = (b.get("capture") or {}).get("format"), (a.get("capture") or {}).get("format")
    if fb != fa:
        out.append(f"different trace formats: {fb} vs {fa}")
    rb, ra = (b.get("capture") or {}).get("ranks") or [], (a.get("capture") or {}).get("ranks") or []
    if len(rb) != len(ra):
        out.append(f"different numbers of ranks: {len(rb)} vs {len(ra)}")
    sb, sa = int((b.get("steps") or {}).get("count") or 0), int((a.get("steps") or {}).get("count") or 0)
    if sb and sa and max(sb, sa) > 1.25 * min(sb, sa):
        out.append(f"step counts differ: {sb} vs {sa} (figures that are totals are not comparable)")
    kb = {str(k.get("name")) for k in b.get("top_kernels") or []}
    ka = {str(k.get("name")) for k in a.get("top_kernels") or []}
    if kb and ka and len(kb & ka) < 0.5 * min(len(kb), len(ka)):
        out.append(f"different workloads: only {len(kb & ka)} of the top kernels are the same")
    return tuple(out)
