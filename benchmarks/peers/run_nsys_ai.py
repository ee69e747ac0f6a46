"""Run nsys-ai's analyses closest to `srtscope diagnose` on one Nsight Systems SQLite export.

Runs INSIDE benchmarks/.peer-venv (never imports srtscope). Uses nsys-ai's public skill API:
`nsys_ai.parquet_cache.open_auto_db` (the same ingest policy `nsys-ai skill run` uses) and
`nsys_ai.skills.registry.run_skill(..., raw=True)` for the skills
  gpu_idle_gaps  (GPU idle gaps / bubbles, with CPU attribution of the top gaps)
  nccl_breakdown (NCCL collectives per stream)
  top_kernels    (kernel hotspots)
on every device in the file, in one process with one connection (the cheapest way to get all three).

Cache modes (nsys-ai writes a Parquet cache `<file>.nsys-cache/` next to the SQLite):
  cold   delete that cache first, then open with the default policy (builds the cache) — a first look
  warm   reuse the cache a previous run built
  direct no cache: DuckDB reads the SQLite directly (NSYS_AI_CACHE_MODE=direct)

Prints one JSON object on stdout: per-device idle figures (ns), NCCL total (ns), top kernels, timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path


def _num(x, default=0.0):
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--cache", choices=("cold", "warm", "direct"), default="cold")
    ap.add_argument("--min-gap-ns", type=int, default=None,
                    help="gpu_idle_gaps threshold (nsys-ai default 1 ms); pass srtscope's bubble threshold")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    if args.cache == "direct":
        os.environ["NSYS_AI_CACHE_MODE"] = "direct"
    import nsys_ai  # noqa: F401  (import cost is part of the peer's wall time)
    from nsys_ai import parquet_cache
    from nsys_ai.skills.registry import run_skill

    cache_dir = Path(args.profile).with_suffix(".nsys-cache")
    if args.cache == "cold" and cache_dir.exists():
        shutil.rmtree(cache_dir)

    t_import = time.perf_counter()
    if args.cache == "direct":
        conn = parquet_cache.open_direct_sqlite(args.profile)
    else:
        conn, err = parquet_cache.open_with_direct_fallback(args.profile, parquet_cache.open_auto_db)
        if conn is None:
            raise RuntimeError(f"nsys-ai could not open {args.profile}: {err}")
    t_open = time.perf_counter()

    # Devices that ran kernels (nsys-ai's skills analyse one device per call).
    try:
        from nsys_ai.connection import wrap_connection
        adapter = wrap_connection(conn)
        ktab = adapter.resolve_activity_tables().get("kernel")
        devices = [int(r[0]) for r in adapter.execute(
            f"SELECT DISTINCT deviceId FROM {ktab} ORDER BY 1").fetchall()] if ktab else []
    except Exception as exc:  # noqa: BLE001 - a peer failure is reported, not hidden
        devices, ktab = [0], None
        print(f"nsys-ai: device listing failed: {exc}", file=sys.stderr)

    gap_kwargs = {"limit": 20}
    if args.min_gap_ns is not None:
        gap_kwargs["min_gap_ns"] = args.min_gap_ns
    per_device = []
    errors = []
    nccl_total_ns = 0.0
    for dev in devices:
        entry = {"device": dev}
        try:
            rows = run_skill("gpu_idle_gaps", conn, raw=True, device=dev, **gap_kwargs)
            summ = next((r for r in rows if r.get("_summary")), {})
            gaps = [r for r in rows if not r.get("_summary") and "gap_ns" in r]
            entry.update(
                gap_count=int(summ.get("gap_count") or 0),
                # sum of per-stream gaps above the threshold (can count one wall-clock gap once per stream)
                stream_gap_sum_ns=_num(summ.get("total_idle_ms")) * 1e6,
                # sweep-line union idle of the device, no threshold (None when nsys-ai could not compute it)
                device_idle_ns=(None if summ.get("device_idle_ms") is None
                                else _num(summ.get("device_idle_ms")) * 1e6),
                span_ns=(None if summ.get("profile_start_ns") is None
                         else int(summ["profile_end_ns"]) - int(summ["profile_start_ns"])),
                top_gap_attribution=[(g.get("attribution") or {}).get("category") for g in gaps[:5]],
            )
        except Exception as exc:  # noqa: BLE001
            errors.append(f"gpu_idle_gaps device {dev}: {type(exc).__name__}: {exc}")
        try:
            rows = run_skill("nccl_breakdown", conn, raw=True, device=dev)
            dev_nccl = sum(_num(r.get("total_ms")) for r in rows if isinstance(r, dict)
                           and not r.get("_abstain") and "total_ms" in r) * 1e6
            entry["nccl_ns"] = dev_nccl
            nccl_total_ns += dev_nccl
        except Exception as exc:  # noqa: BLE001
            errors.append(f"nccl_breakdown device {dev}: {type(exc).__name__}: {exc}")
        per_device.append(entry)

    top = []
    try:
        rows = run_skill("top_kernels", conn, raw=True, limit=args.top)
        top = [{"name": r.get("kernel_name"), "total_ns": _num(r.get("total_ms")) * 1e6,
                "count": r.get("invocations")} for r in rows if "kernel_name" in r]
    except Exception as exc:  # noqa: BLE001
        errors.append(f"top_kernels: {type(exc).__name__}: {exc}")
    t_end = time.perf_counter()

    import importlib.metadata as md
    out = {
        "tool": "nsys-ai",
        "version": md.version("nsys-ai"),
        "cache": args.cache,
        "min_gap_ns": args.min_gap_ns,
        "devices": per_device,
        "gap_count": sum(d.get("gap_count", 0) for d in per_device),
        "stream_gap_sum_ns": sum(d.get("stream_gap_sum_ns", 0.0) for d in per_device),
        "device_idle_ns": (None if any(d.get("device_idle_ns") is None for d in per_device)
                           else sum(d["device_idle_ns"] for d in per_device)),
        "nccl_ns": nccl_total_ns,
        "top_kernels": top,
        "timing_s": {"import": round(t_import - t0, 3), "open": round(t_open - t_import, 3),
                     "analyses": round(t_end - t_open, 3), "total": round(t_end - t0, 3)},
        "errors": errors,
    }
    print(json.dumps(out))
    # partial results (one skill failed) still count as a run; the errors travel in the JSON
    return 0 if any("gap_count" in d for d in per_device) or top else 2


if __name__ == "__main__":
    sys.exit(main())
