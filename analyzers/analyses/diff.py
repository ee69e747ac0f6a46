"""Diff of two diagnoses: the same figures side by side, the change in each, and CI regressions;
each figure's human name and its impact (time per step it moved); kernels and ranges per step;
and a one-line summary of what got better or worse and why."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from srtscope.analyzers.model.vocab import BUBBLE_CLASSES

if TYPE_CHECKING:
    from srtscope.analyzers.model.results import Diagnosis

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


#: figure -> (human name, unit): ``ns`` totals over the capture, ``ns/step`` per mean step, ``count``
LABELS: dict[str, tuple[str, str]] = {
    "device_busy_ns": ("device busy time", "ns"), "window_ns": ("active window", "ns"),
    "bubbles.count": ("bubbles", "count"), "bubbles.total_ns": ("idle time in bubbles", "ns"),
    **{f"bubbles.by_class.{c}_ns": (f"idle while the host was in {c}", "ns") for c in BUBBLE_CLASSES},
    "bubbles.by_class.kernel_ns": ("idle while the host ran model code", "ns"),
    "bubbles.by_class.unattributed_ns": ("idle, host activity unknown", "ns"),
    "steps.count": ("steps", "count"), "steps.graph": ("graph-replay steps", "count"),
    "steps.eager": ("eager steps", "count"), "eager.extra_ns": ("extra time of eager fallback", "ns"),
    "comm.total_ns": ("collective time", "ns"), "comm.exposed_ns": ("exposed collective time", "ns"),
    "comm.skew_ns": ("collective arrival skew", "ns"),
    "budget.mean_step.wall_ns": ("mean step", "ns/step"),
    "budget.mean_step.compute_ns": ("device compute per step", "ns/step"),
    "budget.mean_step.bubbles_ns": ("idle per step", "ns/step"),
    "bubbles.sub_threshold_ns": ("short gaps under the threshold", "ns"),
    "device.memcpy_ns": ("copy time", "ns"), "device.exposed_memcpy_ns": ("copies with no kernel running", "ns"),
}


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

    @property
    def label(self) -> str:
        return LABELS.get(self.name, (self.name, ""))[0]

    @property
    def unit(self) -> str:
        return LABELS.get(self.name, ("", "count" if not self.name.endswith("_ns") else "ns"))[1]

    def per_step_delta(self, steps_before: int, steps_after: int) -> float | None:
        """The change in ns per step: per-step figures as they are, totals over each side's steps;
        None for counts (or totals without steps on both sides)."""
        if self.unit == "ns/step":
            return float(self.delta)
        if self.unit != "ns" or not steps_before or not steps_after:
            return None
        return self.after / steps_after - self.before / steps_before

    def to_json(self) -> dict[str, Any]:
        p = self.pct
        return {"figure": self.name, "label": self.label, "unit": self.unit, "before": self.before,
                "after": self.after, "delta": self.delta, "delta_pct": None if p is None else round(p, 2),
                "better": self.better, "worse": self.worse}


#: the figure ``compare`` gates when none is named: the mean step's wall time
DEFAULT_GATE = "budget.mean_step.wall_ns"
#: a time figure's change counts for the gate only past this much per step (ns) as well
DEFAULT_MIN_CHANGE_NS = 20_000

#: how a gated figure came out: ``regressed`` (worse past both floors) fails the gate
GateOutcome = Literal["regressed", "better", "unchanged", "neutral", "under_pct", "under_floor"]


@dataclass(frozen=True)
class GateCall:
    """One gated figure: ``change`` is what the absolute floor is held against: ns per step for
    time figures (totals over each side's steps), the change itself for counts."""
    figure: FigureDelta
    outcome: GateOutcome
    change: float

    @property
    def regressed(self) -> bool:
        return self.outcome == "regressed"


@dataclass(frozen=True)
class NameDelta:
    """A kernel's or a range's summed time per step, before and after (ns/step; 0 where absent)."""
    name: str
    before_ns: float
    after_ns: float
    before_count: float
    after_count: float

    @property
    def delta_ns(self) -> float:
        return self.after_ns - self.before_ns

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "before_ns_per_step": round(self.before_ns),
                "after_ns_per_step": round(self.after_ns), "delta_ns_per_step": round(self.delta_ns),
                "before_calls_per_step": round(self.before_count, 3),
                "after_calls_per_step": round(self.after_count, 3)}


def name_deltas(before: list[dict], after: list[dict], steps_b: int, steps_a: int) -> tuple[NameDelta, ...]:
    """Per name in either list (``top_kernels`` / ``top_ranges`` records), its time and calls per
    step on each side, largest change first. Without steps a side counts as one step."""
    nb, na = max(steps_b, 1), max(steps_a, 1)
    b = {str(r.get("name")): r for r in before}
    a = {str(r.get("name")): r for r in after}

    def val(side: dict[str, dict], name: str, key: str) -> int:
        return int((side.get(name) or {}).get(key) or 0)

    out = [NameDelta(n, val(b, n, "total_ns") / nb, val(a, n, "total_ns") / na, val(b, n, "count") / nb,
                     val(a, n, "count") / na) for n in dict.fromkeys([*b, *a])]
    return tuple(sorted((x for x in out if x.delta_ns), key=lambda x: (-abs(x.delta_ns), x.name)))


@dataclass(frozen=True)
class DiagnosisDiff:
    before_bottleneck: str
    after_bottleneck: str
    figures: tuple[FigureDelta, ...]
    warnings: tuple[str, ...] = ()       # why the two captures may not be comparable
    before_cause: str = ""
    after_cause: str = ""
    steps_before: int = 0
    steps_after: int = 0
    kernels: tuple[NameDelta, ...] = ()      # per step, largest change first
    ranges: tuple[NameDelta, ...] = ()       # per step, instance numbers as N

    @property
    def changed(self) -> bool:
        """The verdict changed: its class or its cause."""
        return (self.before_bottleneck, self.before_cause) != (self.after_bottleneck, self.after_cause)

    def by_impact(self) -> list[FigureDelta]:
        """The figures that moved, largest change in time per step first, then the counts by their
        change in percent."""
        moved = [f for f in self.figures if f.before != f.after]

        def key(f: FigureDelta) -> tuple[int, float]:
            d = f.per_step_delta(self.steps_before, self.steps_after)
            if d is not None:
                return (0, -abs(d))
            return (1, -abs(f.pct) if f.pct is not None else 0.0)

        return sorted(moved, key=key)

    def summary(self) -> str:
        """One line: the mean step (or idle time) before -> after, the verdict's change, and the
        largest movers per step (figures, then a kernel or range) with their direction."""
        from srtscope.analyzers.model.units import fmt_ns

        def signed(ns: float) -> str:
            return ("+" if ns > 0 else "-") + fmt_ns(abs(ns))

        step = self.figure("budget.mean_step.wall_ns")
        head = step if step.before and step.after else self.figure("bubbles.total_ns")
        word = "unchanged" if head.delta == 0 else ("worse" if head.worse else "better")
        pct = "" if head.pct is None else f", {head.pct:+.1f}%"
        out = f"{head.label} {fmt_ns(head.before)} -> {fmt_ns(head.after)} ({word}{pct})"
        out += (f"; verdict {self.before_bottleneck}/{self.before_cause} -> "
                f"{self.after_bottleneck}/{self.after_cause}" if self.changed
                else f"; verdict unchanged ({self.after_bottleneck}/{self.after_cause})")
        why: list[str] = []
        for f in self.by_impact():
            d = f.per_step_delta(self.steps_before, self.steps_after)
            if f is head or d is None or f.better == "neutral" or f.name in _SUMS:
                continue
            if abs(d) * 50 < abs(float(head.delta) or 1) and why:
                break
            why.append(f"{f.label} {signed(d)}/step")
            if len(why) == 2:
                break
        for kind, rows in (("kernel", self.kernels), ("range", self.ranges)):
            if rows:
                why.append(f"{kind} {_short(rows[0].name)} {signed(rows[0].delta_ns)}/step")
        return out + (": " + ", ".join(why) if why else "")

    def figure(self, name: str) -> FigureDelta:
        for f in self.figures:
            if f.name == name:
                return f
        raise KeyError(f"no figure {name!r}; known: {', '.join(f.name for f in self.figures)}")

    def find(self, name: str) -> FigureDelta | None:
        """The figure named by its JSON key or by its printed label (case and spacing aside)."""
        want = " ".join(name.split()).lower()
        for f in self.figures:
            if f.name == name or f.label.lower() == want:
                return f
        return None

    def gate(self, names: list[str], pct: float, min_change_ns: int = DEFAULT_MIN_CHANGE_NS) -> list[GateCall]:
        """Each of ``names`` (JSON keys or labels; none: ``DEFAULT_GATE``) judged: a regression only
        when it moved the wrong way by more than ``pct`` percent *and* by at least ``min_change_ns``
        per step (a time figure) or by any amount (a count). ValueError for an unknown name."""
        if pct < 0 or min_change_ns < 0:
            raise ValueError(f"gate floors must be >= 0, got {pct} % and {min_change_ns} ns")
        calls = []
        for name in names or [DEFAULT_GATE]:
            f = self.find(name)
            if f is None:
                raise ValueError(name)
            per_step = f.per_step_delta(self.steps_before, self.steps_after)
            timed = per_step is not None or f.name.endswith("_ns")
            change = float(per_step if per_step is not None else f.delta)
            if f.better == "neutral":
                outcome: GateOutcome = "neutral"
            elif f.delta == 0:
                outcome = "unchanged"
            elif not f.worse:
                outcome = "better"
            elif f.pct is not None and abs(f.pct) <= pct:
                outcome = "under_pct"
            elif timed and abs(change) < min_change_ns:
                outcome = "under_floor"
            else:
                outcome = "regressed"
            calls.append(GateCall(f, outcome, change))
        return calls

    def regressions(self, pct: float) -> list[FigureDelta]:
        """Figures that got worse by more than ``pct`` percent (a CI gate fails when non-empty)."""
        if pct < 0:
            raise ValueError(f"regression threshold must be >= 0 %, got {pct}")
        return [f for f in self.figures if f.worse_by(pct)]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": {"before": self.before_bottleneck, "after": self.after_bottleneck,
                            "changed": self.changed,
                            "class_changed": self.before_bottleneck != self.after_bottleneck,
                            "cause_changed": self.before_cause != self.after_cause,
                            "before_cause": self.before_cause, "after_cause": self.after_cause},
                "summary": self.summary(),
                "figures": [f.to_json() for f in self.figures],
                "by_impact": [f.name for f in self.by_impact()],
                "steps": {"before": self.steps_before, "after": self.steps_after},
                "kernels": [k.to_json() for k in self.kernels], "ranges": [r.to_json() for r in self.ranges],
                "warnings": list(self.warnings)}


#: sums of other figures: left out of the summary's reasons (their parts say more)
_SUMS = frozenset({"bubbles.total_ns", "budget.mean_step.bubbles_ns"})


def _short(name: str, width: int = 60) -> str:
    """A kernel or range name for one line: ``void`` and the parameters dropped, template
    arguments as ``<…>``, at most ``width`` characters."""
    n = name[5:] if name.startswith("void ") else name
    head, sep, _ = n.partition("<")
    n = head + ("<…>" if sep else "")
    if not sep and n.endswith(")") and "(" in n:
        n = n[:n.index("(")]
    return n if len(n) <= width else n[:width - 1] + "…"


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> float | int:
    v: Any = doc
    for k in path:
        v = v.get(k, 0) if isinstance(v, dict) else 0
    return v if isinstance(v, (int, float)) and v is not None else 0


def compare(before: Diagnosis, after: Diagnosis) -> DiagnosisDiff:
    """The figures of ``FIGURES`` for both diagnoses, side by side."""
    b, a = before.to_json(), after.to_json()
    figs = tuple(FigureDelta(name, _get(b, path), _get(a, path), better) for name, path, better in FIGURES)
    sb, sa = int(_get(b, ("steps", "count"))), int(_get(a, ("steps", "count")))
    return DiagnosisDiff(b["verdict"]["bottleneck"], a["verdict"]["bottleneck"], figs, comparability(b, a),
                         str(b["verdict"].get("cause", "")), str(a["verdict"].get("cause", "")), sb, sa,
                         name_deltas(b.get("top_kernels") or [], a.get("top_kernels") or [], sb, sa),
                         name_deltas(b.get("top_ranges") or [], a.get("top_ranges") or [], sb, sa))


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
        same = len(kb & ka)
        out.append(f"different workloads: {'none' if not same else f'only {same}'} of the top kernels "
                   f"{'is' if same == 1 else 'are'} the same")
    return tuple(out)
