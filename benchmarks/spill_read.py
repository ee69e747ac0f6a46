"""The nsys export read whole vs read spilled to disk in time order: wall, CPU, peak RSS per size.

    .venv/bin/python -m benchmarks.spill_read                       # 1 and 3 GB exports
    .venv/bin/python -m benchmarks.spill_read --sizes 1000,3000,10000 --runs 2

For each size (MB) the export of ``benchmarks/gen_nsys.py`` under $SRTSCOPE_BENCH_CACHE (default
/tmp/srtscope-bench; made once when missing, skipped while another process makes it), each figure a
whole process (interpreter start and imports included), measured with wait4 (``peers/common.py``):
  whole     ``read_nsys(path)``, then the device and API tables' durations summed
  spilled   ``read_nsys_spilled(path, folder=<temp folder beside the export>)``, then
            ``iter_device()`` and ``iter_api()`` each walked once, summing the same durations
Both print their row counts and sums: they must agree (printed). The whole read is skipped (and
says so) where the memory available would not hold it (~1.1 GiB per GB of export, plus 2 GiB).
``--keep-freed``: both with glibc keeping freed memory (``cli/loading.keep_freed_memory``), as the
``srtscope`` command runs.
Targets (printed, never asserted): spilled peak RSS under ~400 MiB at every size, its wall within
~1.3x of the whole read's.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

from benchmarks.compare_nsys_scale import generated, kernel_count  # noqa: E402
from benchmarks.gen_nsys import cached_name  # noqa: E402

RSS_TARGET_MIB = 400
WALL_TARGET = 1.3
WHOLE_GIB_PER_GB = 1.1


def _child(mode: str, path: str, chunk_rows: int | None, keep_freed: bool) -> None:
    """One read in this process; prints {"device_rows", "api_rows", "device_ns", "api_ns"}."""
    if keep_freed:
        from srtscope.cli.loading import keep_freed_memory

        keep_freed_memory()
    if mode == "whole":
        from srtscope.analyzers.readers.nsys_sqlite import read_nsys

        tl = read_nsys(path)
        out = {"device_rows": len(tl.device), "api_rows": len(tl.api),
               "device_ns": int((tl.device["end_ns"] - tl.device["start_ns"]).sum()),
               "api_ns": int((tl.api["end_ns"] - tl.api["start_ns"]).sum())}
    else:
        from srtscope.analyzers.spill.nsys_spill import DEFAULT_CHUNK_ROWS, read_nsys_spilled

        with tempfile.TemporaryDirectory(dir=Path(path).parent, prefix="spill-") as folder, \
                read_nsys_spilled(path, folder=folder, chunk_rows=chunk_rows or DEFAULT_CHUNK_ROWS) as sp:
            out = {"device_rows": 0, "api_rows": 0, "device_ns": 0, "api_ns": 0}
            for table, frames in (("device", sp.iter_device()), ("api", sp.iter_api())):
                for df in frames:
                    out[f"{table}_rows"] += len(df)
                    out[f"{table}_ns"] += int((df["end_ns"] - df["start_ns"]).sum())
    print(json.dumps(out))


def _series(cmd: list[str], runs: int) -> C.Series:
    s = C.Series()
    for _ in range(runs):
        r = C.run_wait4(cmd, timeout=7200)
        s.runs.append(r)
        print(f"#   {cmd[4]}: {r.wall_s:.2f} s wall, {r.cpu_s:.2f} s CPU ({r.sys_s:.2f} s sys), "
              f"{r.maxrss_mb:.0f} MiB rc={r.rc}", flush=True)
    return s


def _available_gib() -> float | None:
    """MemAvailable of /proc/meminfo, GiB (None where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def measure(size_mb: int, runs: int, chunk_rows: int | None, keep_freed: bool) -> list[list[str]]:
    if (C.CACHE / cached_name(size_mb)).with_suffix(".partial.sqlite").exists():
        print(f"# {size_mb} MB: skipped, its export is being generated", flush=True)
        return []
    path, _ = generated(size_mb)
    nk = kernel_count(path) or 0
    label = f"{path.stat().st_size / 1e6:.0f} MB ({nk / 1e6:.1f} M kernels)"
    print(f"# {path} ({label})", flush=True)
    base = [str(C.PROJECT_PY), "-m", "benchmarks.spill_read", "--child"]
    extra = (["--chunk-rows", str(chunk_rows)] if chunk_rows else []) + (["--keep-freed"] if keep_freed else [])
    # the whole read holds ~1.1 GiB per GB of export: not started where it would crowd the machine
    need, avail = WHOLE_GIB_PER_GB * path.stat().st_size / 1e9 + 2, _available_gib()
    if avail is not None and avail < need:
        print(f"#   whole: skipped, needs ~{need:.0f} GiB, {avail:.0f} GiB available", flush=True)
        whole = C.Series()
    else:
        whole = _series(base + ["whole", str(path), *extra], runs)
    spilled = _series(base + ["spilled", str(path), *extra], runs)
    same = whole.out is not None and whole.out == spilled.out
    rows = []
    for what, s in (("read_nsys (whole)", whole), ("read_nsys_spilled + both iterators", spilled)):
        check = "—"
        if s is spilled:
            rss = f"RSS {'<' if (s.rss or 1e9) < RSS_TARGET_MIB else '>='} {RSS_TARGET_MIB} MiB"
            if whole.wall is None:
                check = f"no whole read to compare; {rss}"
            else:
                check = (f"sums {'agree' if same else 'DIFFER'}; {rss}; wall "
                         f"{'<=' if (s.wall or 1e9) <= WALL_TARGET * whole.wall else '>'} {WALL_TARGET}x")
        sys_s = sorted(r.sys_s for r in s.ok_runs)[len(s.ok_runs) // 2] if s.ok_runs else None
        rows.append([label, what, C.fmt_s(s.wall), C.fmt_s(s.cpu), C.fmt_s(sys_s), C.fmt_mb(s.rss),
                     C.ratio(whole.wall, s.wall), C.ratio(whole.cpu, s.cpu),
                     check if s.ok_runs else (f"FAILED {s.failure()}" if s.runs else "skipped")])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,3000", help="export sizes in MB, comma separated")
    ap.add_argument("--runs", type=int, default=1, help="runs of each measurement (medians)")
    ap.add_argument("--chunk-rows", type=int, default=None, help="rows per bucket (default: the reader's)")
    ap.add_argument("--keep-freed", action="store_true",
                    help="glibc keeps freed memory in both reads, as the srtscope command does")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child[0], a.child[1], a.chunk_rows, a.keep_freed)
        return 0
    C.banner("nsys export read whole vs spilled in time order: wall, CPU, peak RSS")
    rows: list[list[str]] = []
    for size in [int(x) for x in a.sizes.split(",") if x.strip()]:
        rows += measure(size, a.runs, a.chunk_rows, a.keep_freed)
    print()
    print(C.table(["export", "read", "wall", "CPU user+sys", "of it system", "peak RSS", "wall / whole",
                   "CPU / whole", "check"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
