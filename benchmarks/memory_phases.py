"""Where a diagnosis's peak memory comes from: resident memory (RSS) sampled every 10 ms while one
process reads an export and runs ``diagnose``, with the peak of each phase.

    .venv/bin/python -m benchmarks.memory_phases /tmp/srtscope-bench/nsys_1000mb.v2.sqlite

Phases: the reader's tables (``read_nsys``: the device scan, the host scan on its thread), the
Timeline's frames, then each analysis ``diagnose`` calls (wrapped in place, in this process only)
and the JSON. Printed per phase: RSS on entry, the peak inside it and what it added over the entry
(MiB); the largest of these is where a memory budget has to cut first. Runs in-process with the
allocator environment of the ``srtscope`` command (``cli/app.py``) and glibc's default malloc policy
(``--keep-freed`` applies ``cli/loading.keep_freed_memory`` as ``srtscope`` does); no cache.
"""
from __future__ import annotations

import argparse
import functools
import threading
import time
from pathlib import Path

from srtscope.cli.app import ALLOCATOR_ENV  # noqa: F401  (sets the allocator environment)

_PAGE = 4096


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


class Sampler:
    """RSS every ``every_s`` on a thread; ``phase(name)`` marks entry and exit of a phase."""

    def __init__(self, every_s: float = 0.01) -> None:
        self.samples: list[tuple[float, float]] = []
        self.marks: list[tuple[str, float, float]] = []       # (name, t_in, t_out)
        self._stop = threading.Event()
        self._every = every_s
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), _rss_mib()))
            time.sleep(self._every)

    def wrap(self, fn, name: str):
        @functools.wraps(fn)
        def inner(*a, **k):
            t0 = time.perf_counter()
            self.samples.append((t0, _rss_mib()))
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                self.samples.append((t1, _rss_mib()))
                self.marks.append((name, t0, t1))
        return inner

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def report(self) -> list[tuple[str, float, float, float, float]]:
        """(phase, seconds, RSS on entry, peak inside, peak - entry) per mark, in entry order."""
        out = []
        for name, t0, t1 in sorted(self.marks, key=lambda m: m[1]):
            inside = [r for t, r in self.samples if t0 <= t <= t1]
            before = [r for t, r in self.samples if t <= t0]
            enter = before[-1] if before else (inside[0] if inside else 0.0)
            peak = max(inside) if inside else enter
            out.append((name, t1 - t0, enter, peak, peak - enter))
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--keep-freed", action="store_true", help="glibc keeps freed memory, as srtscope")
    a = ap.parse_args(argv)
    if a.keep_freed:
        from srtscope.cli.loading import keep_freed_memory

        keep_freed_memory()
    s = Sampler()
    import srtscope.analyzers.diagnose as D
    import srtscope.analyzers.readers.nsys_sqlite as N
    from srtscope.analyzers.readers import load_timeline
    from srtscope.analyzers.readers.nsys_device import DeviceTables
    from srtscope.analyzers.readers.nsys_host import HostTables

    # the table reads where they are defined (``nsys_sqlite._Reader`` inherits them), the rest of
    # the read where ``nsys_sqlite`` looks them up
    for cls, names in ((DeviceTables, ("kernels", "copies", "graph_execs")), (HostTables, ("api", "osrt", "nvtx"))):
        for name in names:
            setattr(cls, name, s.wrap(getattr(cls, name), f"read: {name}"))
    for name in ("concat_sorted", "_validated", "_read_host"):
        setattr(N, name, s.wrap(getattr(N, name), f"read: {name}"))
    import srtscope.analyzers.pipeline.reduce as R
    import srtscope.analyzers.pipeline.window as W
    # the analyses as the one window's part (W) and the combine (R) call them
    for mod, names in ((D, ("_select_steps",)),
                       (W, ("gaps_part", "launch_calls", "attribute", "step_budget", "step_losses", "kernels_part",
                            "split_part", "bins_part", "comm_part", "cold_part", "streams_part")),
                       (R, ("trace_context", "bubble_result", "by_device", "by_stream", "comm_result", "top_kernels",
                            "device_of", "overview_of", "capture_adequacy", "what_if", "phase_split", "top_ranges",
                            "io_work", "eager_fallback", "decide"))):
        for name in names:
            if hasattr(mod, name):
                setattr(mod, name, s.wrap(getattr(mod, name), f"analysis: {name}"))
    load = s.wrap(load_timeline, "load_timeline (all of the read)")
    diag = s.wrap(D.diagnose, "diagnose (all of the analyses)")
    t0 = time.perf_counter()
    tl = load([str(a.trace)])
    d = diag(tl)
    to_json = s.wrap(lambda: d.to_json(), "to_json")
    to_json()
    s.stop()
    print(f"# {a.trace} ({a.trace.stat().st_size / 1e6:.0f} MB): {len(tl.device):,} device rows, "
          f"{len(tl.api):,} API rows, {len(tl.ranges):,} ranges; {time.perf_counter() - t0:.1f} s; "
          f"peak RSS {max(r for _, r in s.samples):.0f} MiB")
    print("| phase | s | RSS on entry (MiB) | peak inside | added |")
    print("|---|---|---|---|---|")
    for name, sec, enter, peak, added in s.report():
        print(f"| {name} | {sec:.2f} | {enter:.0f} | {peak:.0f} | {added:+.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
