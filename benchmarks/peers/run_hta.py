"""Run Holistic Trace Analysis' idle-time and temporal breakdowns on one PyTorch profiler (Kineto) trace.

Runs INSIDE benchmarks/.peer-venv (never imports srtscope). Public HTA API only:
  TraceAnalysis(trace_files={rank: path}, trace_dir=dir, include_last_profiler_step=...)
  .get_temporal_breakdown(visualize=False)   -> per rank: idle, compute, non-compute, span ("kernel_time")
  .get_idle_time_breakdown(ranks=[rank], visualize=False) -> per stream: host_wait / kernel_wait / other

Prints one JSON object with the figures converted to nanoseconds (HTA works in Kineto's microseconds).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--include-last-profiler-step", action="store_true",
                    help="HTA drops the last ProfilerStep by default; this keeps the whole trace")
    args = ap.parse_args(argv)

    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    path = os.path.abspath(args.trace)
    t_import = time.perf_counter()
    errors: list[str] = []
    try:
        ta = TraceAnalysis(trace_files={args.rank: path}, trace_dir=os.path.dirname(path),
                           include_last_profiler_step=args.include_last_profiler_step)
    except Exception as exc:  # noqa: BLE001 - a peer failure is reported, not hidden
        print(json.dumps({"tool": "hta", "errors": [f"load: {type(exc).__name__}: {exc}"]}))
        return 2
    t_load = time.perf_counter()

    temporal = {}
    try:
        tb = ta.get_temporal_breakdown(visualize=False)
        row = tb[tb["rank"] == args.rank].iloc[0]
        temporal = {"idle": float(row["idle_time(us)"]), "compute": float(row["compute_time(us)"]),
                    "non_compute": float(row["non_compute_time(us)"]),
                    "span": float(row["kernel_time(us)"])}
    except Exception as exc:  # noqa: BLE001
        errors.append(f"temporal_breakdown: {type(exc).__name__}: {exc}")
    t_temporal = time.perf_counter()

    idle_by_cat: dict[str, float] = {}
    n_streams = 0
    try:
        ib, _ = ta.get_idle_time_breakdown(ranks=[args.rank], visualize=False)
        n_streams = int(ib["stream"].nunique())
        for cat, grp in ib.groupby("idle_category"):
            idle_by_cat[str(cat)] = float(grp["idle_time"].sum())
    except Exception as exc:  # noqa: BLE001
        errors.append(f"idle_time_breakdown: {type(exc).__name__}: {exc}")
    t_idle = time.perf_counter()

    # HTA keeps Kineto's unit (microseconds; ns-resolution traces are rounded to whole microseconds,
    # ts up / end down, unless HTA_DISABLE_NS_ROUNDING=1). Convert to ns.
    f = 1000.0
    rounding = os.environ.get("HTA_DISABLE_NS_ROUNDING", "0") not in ("1", "true", "True")

    import importlib.metadata as md
    ver = None
    for dist in ("traceinsight", "HolisticTraceAnalysis"):
        try:
            ver = f"{dist} {md.version(dist)}"
            break
        except md.PackageNotFoundError:
            continue
    out = {
        "tool": "hta",
        "version": ver,
        "rank": args.rank,
        "include_last_profiler_step": args.include_last_profiler_step,
        "ns_rounding_to_us": rounding,
        # temporal breakdown: union idle of the rank's GPU between its first and last GPU event
        "temporal_idle_ns": temporal.get("idle", 0.0) * f if temporal else None,
        "temporal_span_ns": temporal.get("span", 0.0) * f if temporal else None,
        "temporal_compute_ns": temporal.get("compute", 0.0) * f if temporal else None,
        "temporal_non_compute_ns": temporal.get("non_compute", 0.0) * f if temporal else None,
        # idle-time breakdown: per-stream gaps between consecutive kernels, summed over streams
        "stream_idle_ns_by_category": {k: v * f for k, v in idle_by_cat.items()},
        "stream_idle_ns": sum(idle_by_cat.values()) * f if idle_by_cat else None,
        "streams": n_streams,
        "timing_s": {"import": round(t_import - t0, 3), "load": round(t_load - t_import, 3),
                     "temporal": round(t_temporal - t_load, 3), "idle": round(t_idle - t_temporal, 3),
                     "total": round(t_idle - t0, 3)},
        "errors": errors,
    }
    print(json.dumps(out))
    # partial results (one analysis failed) still count as a run; the errors travel in the JSON
    return 0 if (temporal or idle_by_cat) else 2


if __name__ == "__main__":
    sys.exit(main())
