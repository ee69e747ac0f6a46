"""Analysis scale: ``diagnose`` over a generated in-memory Timeline of N device activities + N API calls.

    python -m benchmarks.analysis_scale [--n 2000000] [--per-step 100]

Shape: one rank, one device, two streams; every kernel has its launch (correlated); each step of
``per_step`` kernels is framed by NVTX stages (loop.step > sched.schedule, prep.batch, run.eager,
sync.wait) and ends with a cudaStreamSynchronize; jittered gaps make real bubbles. Prints the
build and analysis times (seconds) and the figures found; the target is analysis < 20 s for 2M + 2M.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.timeline import ApiKind, DeviceKind, SourceFormat, Timeline, TimelineMeta, Traced


def build(n: int, per_step: int, seed: int = 0) -> Timeline:
    rng = np.random.default_rng(seed)
    steps = max(n // per_step, 1)
    n = steps * per_step
    k = np.arange(n)
    host_gap = rng.integers(2_000, 20_000, n)                  # ns between launches
    host_gap[k % per_step == 0] = 400_000                      # scheduler + prep before each step
    launch_start = np.cumsum(host_gap + 4_000)
    launch_end = launch_start + 4_000
    kdur = rng.integers(3_000, 15_000, n)
    # device queue: start = max(launch_end + 2 µs, previous end) — vectorised as a running max of
    # (launch_end + latency - prefix of durations) plus that prefix.
    prefix = np.r_[0, np.cumsum(kdur)[:-1]]
    kstart = np.maximum.accumulate(launch_end + 2_000 - prefix) + prefix
    kend = kstart + kdur
    pid, tid = 4242, 4243
    device = pd.DataFrame({"start_ns": kstart, "end_ns": kend, "kind": DeviceKind.KERNEL.value,
                           "name": pd.Categorical.from_codes(k % 37, [f"kernel_{i}" for i in range(37)]),
                           "device": 0, "stream": 7 + (k % 2), "pid": pid, "correlation": k + 1})
    api = pd.DataFrame({"start_ns": launch_start, "end_ns": launch_end, "pid": pid, "tid": tid,
                        "name": "cudaLaunchKernel", "kind": ApiKind.LAUNCH.value, "correlation": k + 1})
    first = np.flatnonzero(k % per_step == 0)
    last = np.r_[first[1:] - 1, n - 1]
    s0 = launch_start[first] - 400_000
    run0 = launch_start[first]
    run1 = launch_end[last]
    sync1 = kend[last] + 3_000
    names = np.repeat(np.array(["loop.step", "sched.schedule", "prep.batch", "run.eager", "sync.wait"],
                               dtype=object)[None, :], steps, axis=0).ravel()
    st = np.stack([s0, s0, s0 + 250_000, run0, run1], axis=1).ravel()
    en = np.stack([sync1, s0 + 250_000, run0, run1, sync1], axis=1).ravel()
    ranges = pd.DataFrame({"start_ns": st, "end_ns": en, "pid": pid, "tid": tid,
                           "name": pd.Categorical(names), "domain": "srtscope",
                           "attrs": np.full(len(st), None, dtype=object)})
    api_sync = pd.DataFrame({"start_ns": run1, "end_ns": sync1, "pid": pid, "tid": tid,
                             "name": "cudaStreamSynchronize", "kind": ApiKind.SYNC.value,
                             "correlation": -1})
    meta = TimelineMeta(format=SourceFormat.SYNTHETIC, sources=["benchmark"],
                        traced={Traced.KERNELS, Traced.API, Traced.NVTX})
    return Timeline.build(meta, device=device, api=pd.concat([api, api_sync], ignore_index=True),
                          ranges=ranges)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="device activities (and API launches)")
    ap.add_argument("--per-step", type=int, default=100)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    tl = build(a.n, a.per_step)
    t1 = time.perf_counter()
    d = diagnose(tl)
    t2 = time.perf_counter()
    j = d.to_json()
    print(f"device rows {len(tl.device):,}  api rows {len(tl.api):,}  ranges {len(tl.ranges):,}")
    print(f"build {t1 - t0:.2f} s   diagnose {t2 - t1:.2f} s   (target < 20 s)")
    print(f"bubbles {j['bubbles']['count']:,} total {j['bubbles']['total_ns'] / 1e9:.3f} s  "
          f"by_class {j['bubbles']['by_class']}")
    print(f"steps {j['steps']['count']:,}  verdict {j['verdict']['bottleneck']} "
          f"({j['verdict']['confidence']}): {j['verdict']['summary']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
