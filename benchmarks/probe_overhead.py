"""Cost per probe range, against an empty loop in the same run.

Three configurations: disabled; enabled, recorder only (NVTX off); enabled with NVTX calls (no
collector attached, as in production without nsys). Each is the median of several repeats of N
ranges, minus the empty loop's per-iteration cost. Absolute µs do not travel between machines, so
the targets are ratios against what the same process pays for a no-op ``with`` and a clock read:
a disabled range ≤ 1.2x a no-op with; an enabled range (recorder only) ≤ 2 clock reads + 1 no-op
with; NVTX with attributes ≤ 2x the recorder-only cost with attributes.

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
from srtscope.probes.ranges import stage  # noqa: E402
from srtscope.probes.recorder import Recorder, set_recorder  # noqa: E402


class _Noop:
    """The cheapest context manager Python has: what a probe range can at best cost."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP = _Noop()


def _empty(n: int) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        pass
    return perf_counter_ns() - t


def _noop_with(n: int) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        with _NOOP:
            pass
    return perf_counter_ns() - t


def _clock(n: int) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        perf_counter_ns()
    return perf_counter_ns() - t


def _plain(n: int) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        with stage("sched.schedule"):
            pass
    return perf_counter_ns() - t


def _attrs(n: int) -> int:
    t = perf_counter_ns()
    for i in range(n):
        with stage("loop.step", step=i, bs=32):
            pass
    return perf_counter_ns() - t


def measure(fn, n: int, repeats: int) -> float:
    """Median ns per iteration over repeats, recorder cleared between repeats."""
    out = []
    for _ in range(repeats):
        set_recorder(Recorder())
        out.append(fn(n) / n)
    return statistics.median(out)


#: targets, as multiples of what this machine pays for the same Python in the same process
TARGETS = (("disabled range / no-op with", 1.2),
           ("enabled range (recorder) / (2 clock reads + no-op with)", 1.0),
           ("NVTX + 2 attrs / recorder + 2 attrs", 2.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    base = measure(_empty, args.n, args.repeats)
    noop = measure(_noop_with, args.n, args.repeats) - base
    clock = measure(_clock, args.n, args.repeats) - base
    cost = {}
    for label, setup in (("disabled", ranges.disable),
                         ("recorder", lambda: ranges.enable(nvtx=False)),
                         ("nvtx", lambda: ranges.enable(nvtx=True))):
        setup()
        cost[label] = (measure(_plain, args.n, args.repeats) - base,
                       measure(_attrs, args.n, args.repeats) - base)
    ranges.disable()

    print(f"probe overhead per range, {os.cpu_count()} cores, n={args.n}, median of {args.repeats}")
    print(f"baselines in this process: no-op with {noop:.0f} ns, clock read {clock:.0f} ns")
    print(f"{'configuration':<26}{'no attrs (ns)':>15}{'2 attrs (ns)':>15}")
    for label, (plain, attrs) in cost.items():
        print(f"{label:<26}{plain:>15.0f}{attrs:>15.0f}")
    ratios = (max(cost["disabled"]) / noop, cost["recorder"][0] / (2 * clock + noop),
              cost["nvtx"][1] / cost["recorder"][1])
    print(f"{'ratio':<58}{'measured':>10}{'target':>8}  ok")
    for (label, target), r in zip(TARGETS, ratios):
        print(f"{label:<58}{r:>10.2f}{target:>8.1f}  {'yes' if r <= target else 'NO'}")


if __name__ == "__main__":
    main()
