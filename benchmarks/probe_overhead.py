"""Cost per probe range, against an empty loop in the same run.

Four configurations: disabled; enabled, recorder only (NVTX off); enabled with NVTX asked for and no
collector attached, as in production without nsys (NVTX is then idle: no NVTX call is made); and,
for reference, "nvtx live": the NVTX path a collector gets (under nsys), forced onto the nvtx
package's no-op domain, so it counts srtscope's side of each push/pop but not the collector's work.
Each is the median of several repeats of N ranges, minus the empty loop's per-iteration cost.
Absolute µs do not travel between machines, so the targets are ratios against what the same process
pays for a no-op ``with`` and a clock read: a disabled range ≤ 1.2x a no-op with; an enabled range
(recorder only) ≤ 2 clock reads + 1 no-op with; NVTX (no collector) with attributes ≤ 2x the
recorder-only cost with attributes.

Run with the implementation ``stage()`` takes here (the C extension where built) and, beside it,
the pure Python path (``ranges._py_stage`` with ``ranges.set_pure(True)``), interleaved in one
process; the ``ok`` column judges the implementation in use.

    python benchmarks/probe_overhead.py [--n 200000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from time import perf_counter_ns

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from srtscope.probes import ranges  # noqa: E402
from srtscope.probes.recorder import Recorder, set_recorder  # noqa: E402


class _Noop:
    """The cheapest context manager Python has: what a probe range can at best cost."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP = _Noop()


def _empty(n: int, _: object = None) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        pass
    return perf_counter_ns() - t


def _noop_with(n: int, noop: _Noop = _NOOP) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        with noop:
            pass
    return perf_counter_ns() - t


def _clock(n: int, clock=perf_counter_ns) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        clock()
    return perf_counter_ns() - t


def _plain(n: int, stage) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        with stage("sched.schedule"):
            pass
    return perf_counter_ns() - t


def _attrs(n: int, stage) -> int:
    t = perf_counter_ns()
    for i in range(n):
        with stage("loop.step", step=i, bs=32):
            pass
    return perf_counter_ns() - t


def measure(cases: dict[str, tuple], n: int, repeats: int) -> dict[str, float]:
    """Median ns per iteration of each case, ``{key: (setup, loop, arg)}``. The repeats go round
    all the cases in turn, so a load change on the shared machine shifts them all alike; the
    recorder is new for every run."""
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for key, (setup, loop, arg) in cases.items():
            setup()
            set_recorder(Recorder())
            out[key].append(loop(n, arg) / n)
    return {k: statistics.median(v) for k, v in out.items()}


#: targets, as multiples of what this machine pays for the same Python in the same process
TARGETS = (("disabled range / no-op with", 1.2),
           ("enabled range (recorder) / (2 clock reads + no-op with)", 1.0),
           ("NVTX + 2 attrs / recorder + 2 attrs", 2.0))
def _nvtx_live() -> None:
    """NVTX on as with a collector attached, but pushing to nvtx's no-op domain."""
    import nvtx

    ranges.enable(nvtx=True)
    ranges._STATE.domain = nvtx.get_domain(ranges.DOMAIN)
    ranges._STATE.nvtx = True


CONFIGS = (("disabled", ranges.disable),
           ("recorder", lambda: ranges.enable(nvtx=False)),
           ("nvtx", lambda: ranges.enable(nvtx=True)),
           ("nvtx live", _nvtx_live))


def _idle_status() -> str:
    ranges.enable(nvtx=True)
    status = ranges.nvtx_status()
    ranges.disable()
    return status


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    # the implementation stage() takes here, then the Python path beside it (the same if no C)
    native = ranges.implementation()
    impls = {native: (ranges.set_pure(False), ranges.stage)}
    impls["Python"] = (True, ranges._py_stage)
    none = lambda: None  # noqa: E731
    cases: dict[str, tuple] = {"empty": (none, _empty, None), "noop": (none, _noop_with, _NOOP),
                               "clock": (none, _clock, perf_counter_ns)}
    for impl, (pure, fn) in impls.items():
        for label, setup in CONFIGS:
            def prepare(pure: bool = pure, setup=setup) -> None:
                ranges.set_pure(pure)
                setup()

            cases[f"{impl}/{label}/plain"] = (prepare, _plain, fn)
            cases[f"{impl}/{label}/attrs"] = (prepare, _attrs, fn)
    med = measure(cases, args.n, args.repeats)
    ranges.disable()
    ranges.set_pure(False)

    base = med.pop("empty")
    noop, clock = med.pop("noop") - base, med.pop("clock") - base
    cost = {k: v - base for k, v in med.items()}
    print(f"probe overhead per range, {os.cpu_count()} cores, n={args.n}, median of {args.repeats}")
    print(f"implementation in use: {native}" + ("" if native == "Python" else
          " (srtscope.probes._fastrange; live NVTX ranges take the Python path)")
          + f"; NVTX without a collector here: {_idle_status()}")
    print(f"baselines in this process: no-op with {noop:.0f} ns, clock read {clock:.0f} ns")
    heads = "".join(f"{impl + ' ' + h:>22}" for impl in impls for h in ("no attrs (ns)", "2 attrs (ns)"))
    print(f"{'configuration':<12}{heads}")
    for label, _ in CONFIGS:
        row = "".join(f"{cost[f'{impl}/{label}/{k}']:>22.0f}" for impl in impls for k in ("plain", "attrs"))
        print(f"{label:<12}{row}")
    print("(nvtx: NVTX asked for, no collector attached; nvtx live: the path under nsys, into a no-op domain)")

    def ratios(impl: str) -> tuple[float, float, float]:
        c = {label: (cost[f"{impl}/{label}/plain"], cost[f"{impl}/{label}/attrs"]) for label, _ in CONFIGS}
        return (max(c["disabled"]) / noop, c["recorder"][0] / (2 * clock + noop), c["nvtx"][1] / c["recorder"][1])

    got = {impl: ratios(impl) for impl in impls}
    print(f"{'ratio':<58}" + "".join(f"{impl:>10}" for impl in impls) + f"{'target':>8}  ok ({native})")
    for i, (label, target) in enumerate(TARGETS):
        r = got[native][i]
        print(f"{label:<58}" + "".join(f"{got[impl][i]:>10.2f}" for impl in impls)
              + f"{target:>8.1f}  {'yes' if r <= target else 'NO'}")


if __name__ == "__main__":
    main()
