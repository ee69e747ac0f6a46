"""Cost per probe range, against an empty loop in the same run.

Three configurations: disabled; enabled, recorder only (NVTX off); enabled with NVTX calls (no
collector attached, as in production without nsys). Each is the median of several repeats of N
ranges, minus the empty loop's per-iteration cost. Prints a table in microseconds per range.

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

TARGET_US = {"disabled": 0.2, "enabled (recorder only)": 2.0, "enabled + NVTX calls": 2.0}


def _empty(n: int) -> int:
    t = perf_counter_ns()
    for _ in range(n):
        pass
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    rows = []
    for label, setup in (("disabled", ranges.disable),
                         ("enabled (recorder only)", lambda: ranges.enable(nvtx=False)),
                         ("enabled + NVTX calls", lambda: ranges.enable(nvtx=True))):
        setup()
        base = measure(_empty, args.n, args.repeats)
        plain = measure(_plain, args.n, args.repeats) - base
        with_attrs = measure(_attrs, args.n, args.repeats) - base
        rows.append((label, plain / 1000, with_attrs / 1000, TARGET_US[label]))
    ranges.disable()

    print(f"probe overhead per range, {os.cpu_count()} cores, n={args.n}, median of {args.repeats}")
    print(f"{'configuration':<26}{'no attrs (us)':>15}{'2 attrs (us)':>15}{'target (us)':>13}  ok")
    for label, plain, with_attrs, target in rows:
        ok = "yes" if max(plain, with_attrs) <= target else "NO"
        print(f"{label:<26}{plain:>15.3f}{with_attrs:>15.3f}{target:>13.1f}  {ok}")


if __name__ == "__main__":
    main()
