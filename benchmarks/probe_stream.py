"""Cost of a probe stream's flush per span, against recording that span, in the same process.

``--backend probe`` processes append the spans recorded since their last flush to their trace
(``probes.export.ProbeStreamWriter``) every ``SRTSCOPE_PROBE_FLUSH_S`` seconds, in a flush thread
(it holds the GIL while it encodes). Figures, as ratios since absolute µs do not travel: a flush's
cost per span / the cost of recording one enabled range (recorder only), at 100, 1000 and 10000
spans a flush; and the whole-document rewrite the flusher did before (every flush re-encoded every
span recorded so far), per span of the trace, at the same sizes.

    python benchmarks/probe_stream.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from time import perf_counter_ns

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from srtscope.probes import ranges  # noqa: E402
from srtscope.probes.export import ProbeStreamWriter, write_probe_trace  # noqa: E402
from srtscope.probes.recorder import Recorder, set_recorder  # noqa: E402

NAMES = ("sched.recv", "sched.schedule", "prep.batch", "run.eager", "run.sample", "sched.result")


def _record(n: int) -> int:
    """Record ``n`` ranges through ``stage()``; ns per range."""
    t = perf_counter_ns()
    for i in range(n):
        with ranges.stage(NAMES[i % 6]):
            pass
    return (perf_counter_ns() - t) // n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    ranges.enable(nvtx=False)
    folder = tempfile.mkdtemp()
    print(f"{'spans/flush':>11} {'record ns':>9} {'flush ns/span':>13} {'ratio':>6} "
          f"{'rewrite ns/span':>15} {'ratio':>6}")
    for per_flush in (100, 1000, 10000):
        rec, flush, rewrite = [], [], []
        for r in range(a.repeats):
            recorder = Recorder()
            set_recorder(recorder)
            w = ProbeStreamWriter(recorder, os.path.join(folder, f"s{per_flush}.{r}.json.gz"))
            rec.append(_record(per_flush))
            t = perf_counter_ns()
            w.flush()
            flush.append((perf_counter_ns() - t) / per_flush)
            t = perf_counter_ns()
            write_probe_trace(recorder, os.path.join(folder, f"d{per_flush}.{r}.json.gz"))
            rewrite.append((perf_counter_ns() - t) / per_flush)
        rn, fl, rw = statistics.median(rec), statistics.median(flush), statistics.median(rewrite)
        print(f"{per_flush:>11} {rn:>9.0f} {fl:>13.0f} {fl / rn:>6.1f} {rw:>15.0f} {rw / rn:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
