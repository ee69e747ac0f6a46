"""srtscope vs Holistic Trace Analysis (HTA) on PyTorch-profiler (Kineto) traces: speed, memory, idle time.

    .venv/bin/python benchmarks/compare_kineto.py [--runs 3] [--large-runs 2] [--large-kernels 100000]
                                                  [--no-large] [--setup]

Inputs: every real trace in ../shared/traces/real/kineto/ (read in place) and one generated large trace
(benchmarks/peers/gen_kineto.py, cached under $SRTSCOPE_BENCH_CACHE, default /tmp/srtscope-bench).
Each tool runs in its own subprocess, interleaved run by run; medians of wall time and peak RSS.

  srtscope  `srtscope diagnose TRACE --json --threshold-us 0` (or the in-process driver until the CLI
            exists); threshold 0 because HTA counts every gap, however short — the like-for-like run,
            used for the idle figures and the ratios. Also timed with its default threshold (5 µs),
            what users run: with threshold 0 every gap is a bubble to attribute, which costs more.
            device idle = active window - busy (union of the device's streams), summed over devices;
            per-stream idle = gaps between consecutive activities of each stream, summed.
  HTA       TraceAnalysis(include_last_profiler_step=True, so both look at the whole trace) +
            get_temporal_breakdown (union idle of the rank's GPU, first to last GPU event) +
            get_idle_time_breakdown (per-stream gaps: host wait / kernel wait / other), as users run it
            (ns timestamps rounded to whole µs). One more, untimed run with HTA_DISABLE_NS_ROUNDING=1
            separates HTA's rounding from real differences.

Agreement: |srtscope - HTA| / max, on both idle figures; every difference over 5% gets a reason in the
table (the automatic one when HTA without rounding agrees; otherwise see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

REAL = C.ROOT.parent / "shared" / "traces" / "real" / "kineto"


def large_trace(kernels: int) -> Path:
    out = C.CACHE / f"kineto_{kernels // 1000}k.json.gz"
    if not out.exists():
        C.CACHE.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".partial")
        r = C.run_wait4([str(C.PROJECT_PY), str(C.PEERS / "gen_kineto.py"), "--kernels", str(kernels), str(tmp)],
                        timeout=3600)
        if r.rc != 0:
            raise SystemExit(f"gen_kineto failed: {r.stderr}")
        tmp.rename(out)
    return out


def srt_idle(out: dict | None) -> tuple[float | None, float | None, float | None]:
    """(device idle ns, per-stream idle ns, window ns) from the JSON contract."""
    if not out:
        return None, None, None
    b = out.get("bubbles") or {}
    dev = sum(d["window_ns"] - d["busy_ns"] for d in b.get("by_device", [])) if b.get("by_device") else \
        b.get("window_ns", 0) - b.get("busy_ns", 0)
    streams = sum(s.get("gap_ns", 0) for s in b.get("by_stream", []))
    return float(dev), float(streams), float(b.get("window_ns", 0))


def explain(diff: float | None, diff_norounding: float | None) -> str:
    if diff is None:
        return "HTA failed"
    if diff <= 5:
        return "agree"
    if diff_norounding is not None and diff_norounding <= 5:
        return (f"HTA rounds ns timestamps to whole µs (ts up, end down): {diff:.1f}% -> "
                f"{diff_norounding:.1f}% without it")
    plain = "—" if diff_norounding is None else f"{diff_norounding:.1f}%"
    return f"differs {diff:.1f}% (no rounding: {plain}) — see README"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--large-runs", type=int, default=2)
    ap.add_argument("--large-kernels", type=int, default=100_000)
    ap.add_argument("--no-large", action="store_true")
    ap.add_argument("--only", default="", help="substring filter on trace names")
    ap.add_argument("--setup", action="store_true", help="(re)run benchmarks/peers/setup_peers.sh first")
    args = ap.parse_args(argv)

    status = C.start("srtscope vs HTA on Kineto traces", args.setup, peers=("hta",))
    hta_ok = status.get("hta", "").startswith("ok")

    traces = sorted(REAL.glob("*.json*")) if REAL.exists() else []
    if not traces:
        print(f"# no real Kineto traces under {REAL}")
    if not args.no_large:
        traces.append(large_trace(args.large_kernels))
    if args.only:
        traces = [t for t in traces if args.only in t.name]

    perf_rows, agree_rows, results = [], [], []
    for path in traces:
        large = path.parent != REAL
        n = args.large_runs if large else args.runs
        name = path.name.replace(".json.gz", "").replace(".json", "")
        mb = path.stat().st_size / 1e6
        print(f"# {name} ({mb:.1f} MB gz); {n} runs each", flush=True)
        hta_cmd = [str(C.PEER_PY), str(C.PEERS / "run_hta.py"), str(path), "--include-last-profiler-step"]
        srt, srt_def, hta = C.Series(), C.Series(), C.Series()
        for _ in range(n):
            srt.runs.append(C.run_wait4(C.srtscope_command([path], threshold_us=0)))
            srt_def.runs.append(C.run_wait4(C.srtscope_command([path])))
            if hta_ok:
                hta.runs.append(C.run_wait4(hta_cmd, env=C.peer_env()))
        hta_nr = C.run_wait4(hta_cmd, env=C.peer_env({"HTA_DISABLE_NS_ROUNDING": "1"})) if hta_ok else None
        print(f"#   srtscope(0 µs) {C.fmt_s(srt.wall)} {C.fmt_mb(srt.rss)}; srtscope(default) "
              f"{C.fmt_s(srt_def.wall)} {C.fmt_mb(srt_def.rss)}; HTA {C.fmt_s(hta.wall)} {C.fmt_mb(hta.rss)}",
              flush=True)

        s_dev, s_str, s_win = srt_idle(srt.out)
        h = hta.out or {}
        hn = (hta_nr.out if hta_nr and hta_nr.ok else None) or {}
        h_err = "; ".join(h.get("errors", [])) if h else (hta.failure() if hta_ok else status.get("hta"))
        h_dev, h_str = h.get("temporal_idle_ns"), h.get("stream_idle_ns")
        d_dev, d_str = C.pct_diff(s_dev, h_dev), C.pct_diff(s_str, h_str)
        dn_dev = C.pct_diff(s_dev, hn.get("temporal_idle_ns"))
        dn_str = C.pct_diff(s_str, hn.get("stream_idle_ns"))

        label = f"{name}{' (generated)' if large else ''}"
        perf_rows.append([label, f"{mb:.1f}", C.fmt_s(srt.wall), C.fmt_mb(srt.rss),
                          C.fmt_s(srt_def.wall), C.fmt_mb(srt_def.rss),
                          C.fmt_s(hta.wall) if hta.ok_runs else "FAILED", C.fmt_mb(hta.rss),
                          C.ratio(srt.wall, hta.wall), C.ratio(srt.cpu, hta.cpu), C.ratio(srt.rss, hta.rss)])
        fmt_pct = lambda d: "—" if d is None else f"{d:.1f}%"  # noqa: E731
        agree_rows.append([label, C.fmt_ms(s_dev), C.fmt_ms(h_dev), fmt_pct(d_dev),
                           explain(d_dev, dn_dev) if h_dev is not None else f"HTA: {h_err or 'no figure'}",
                           C.fmt_ms(s_str), C.fmt_ms(h_str), fmt_pct(d_str),
                           explain(d_str, dn_str) if h_str is not None else f"HTA: {h_err or 'no figure'}"])
        results.append({"trace": str(path), "generated": large, "runs": n,
                        "srtscope_default_threshold": {"wall_s": srt_def.wall, "rss_mb": srt_def.rss,
                                                       "failure": srt_def.failure()},
                        "srtscope": {"wall_s": srt.wall, "cpu_s": srt.cpu, "rss_mb": srt.rss, "device_idle_ns": s_dev,
                                     "stream_idle_ns": s_str, "window_ns": s_win,
                                     "verdict": (srt.out or {}).get("verdict", {}).get("bottleneck"),
                                     "failure": srt.failure()},
                        "hta": {"wall_s": hta.wall, "cpu_s": hta.cpu, "rss_mb": hta.rss, "out": h,
                                "failure": hta.failure()},
                        "hta_no_rounding": hn,
                        "diff_pct": {"device": d_dev, "stream": d_str,
                                     "device_no_rounding": dn_dev, "stream_no_rounding": dn_str}})

    print("\n## speed and memory (medians)\n")
    print(C.table(["trace", "MB (gz)", "srtscope wall (0 µs)", "srtscope RSS (0 µs)",
                   "srtscope wall (5 µs default)", "srtscope RSS (5 µs default)", "HTA wall", "HTA RSS",
                   "HTA / srtscope(0 µs) wall", "HTA / srtscope(0 µs) CPU", "HTA / srtscope(0 µs) memory"],
                  perf_rows))
    print("\n## idle time: srtscope vs HTA (HTA as users run it, ns rounded to µs)\n")
    print(C.table(["trace", "srtscope device idle", "HTA temporal idle", "diff", "why",
                   "srtscope per-stream idle", "HTA idle breakdown (sum)", "diff", "why"], agree_rows))
    print(f"\nresults: {C.save_results('compare_kineto', {'machine': C.cores(), 'results': results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
