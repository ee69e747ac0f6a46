"""``DiagnoseParams``: what a diagnosis is asked (thresholds, step range), validated once.

Kept apart from ``diagnose.py`` so that the CLI can key a cached answer by it without importing the
analyses (numpy, pandas).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from srtscope.analyzers.analyses.attribution import BurstRule
    from srtscope.analyzers.analyses.steps import StepRule


@dataclass(frozen=True)
class DiagnoseParams:
    """Thresholds, inference-scale defaults (µs, not nsys's 500 ms gap rule)."""

    threshold_us: float = 5.0            # a device gap longer than this is a bubble
    burst_gap_us: float = 30.0           # launches closer than this belong to one burst
    burst_min_launches: int = 4          # ... and a burst has at least this many
    step_gap_us: float = 200.0           # no-NVTX fallback: a launch gap this long ends a step
    step_range: tuple[int, int] | None = None   # analyse only steps first..last (inclusive)
    healthy_pct: float = 10.0            # lost time under this % of the window = healthy
    min_skew_us: float = 10.0            # collectives skewed more than this name a straggler
    top_kernels: int = 10

    def __post_init__(self) -> None:
        for name in ("threshold_us", "burst_gap_us", "min_skew_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.step_gap_us <= 0:
            raise ValueError(f"step_gap_us must be > 0, got {self.step_gap_us}")
        if self.burst_min_launches < 1:
            raise ValueError(f"burst_min_launches must be >= 1, got {self.burst_min_launches}")
        if not 0 < self.healthy_pct < 100:
            raise ValueError(f"healthy_pct must be in (0, 100), got {self.healthy_pct}")
        if self.top_kernels < 0:
            raise ValueError(f"top_kernels must be >= 0, got {self.top_kernels}")
        if self.step_range is not None:
            a, b = self.step_range
            if a < 0 or b < a:
                raise ValueError(f"step_range must be (first, last) with 0 <= first <= last, got {self.step_range}")

    @property
    def threshold_ns(self) -> int:
        return int(round(self.threshold_us * 1000))

    @property
    def burst_rule(self) -> BurstRule:
        from srtscope.analyzers.analyses.attribution import BurstRule

        return BurstRule(int(round(self.burst_gap_us * 1000)), self.burst_min_launches)

    @property
    def step_rule(self) -> StepRule:
        from srtscope.analyzers.analyses.steps import StepRule

        return StepRule(int(round(self.step_gap_us * 1000)))
def params_json(params: DiagnoseParams) -> dict:
    """The parameters as the JSON contract gives them."""
    p = asdict(params)
    p["step_range"] = list(params.step_range) if params.step_range else None
    return p
