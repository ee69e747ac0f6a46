"""The memory estimate against measured peaks, and a diagnosis kept within ``--memory-budget``.

    .venv/bin/python -m benchmarks.memory_budget                          # 300 MB, 1 GB, 3 GB + real traces
    .venv/bin/python -m benchmarks.memory_budget --sizes 3000 --budget 2GiB --no-real

Per export of ``benchmarks/gen_nsys.py`` (cached under $SRTSCOPE_BENCH_CACHE, default
/tmp/srtscope-bench), each figure one whole process measured with wait4 (``peers/common.py``):
  whole         ``srtscope diagnose --json --no-cache --memory-budget none FILE``
  filling       the same, filling a fresh private table cache (``SRTSCOPE_CACHE_DIR``): the default
                run's peak
  budget        ``srtscope diagnose --json --no-cache --memory-budget BUDGET FILE`` (only where the
                estimate is over BUDGET: a windowed read)
and the estimate (``readers/memory_estimate.py``) beside the measured peaks: estimate / peak must be
>= 1 (conservative) and is meant to be <= 1.25. Real traces (``shared/traces/real``): the whole run
only, calibrating the base. Printed, never asserted. This process imports no part of srtscope (the
estimates come from a child), so every child's peak RSS is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

from benchmarks.compare_nsys_scale import generated  # noqa: E402

SRTSCOPE = str(C.ROOT / ".venv" / "bin" / "srtscope")
REAL = C.ROOT.parent / "shared" / "traces" / "real"


_ESTIMATE = ("import json, sys; from pathlib import Path; "
             "from srtscope.analyzers.readers import detect_format; "
             "from srtscope.analyzers.readers.memory_estimate import estimate; "
             "from srtscope.cli.memory_budget import parse_budget; "
             "p = Path(sys.argv[1]); e = estimate(p, detect_format(p)); "
             "print(json.dumps({'peak': e.peak_bytes, 'rows': sum(e.rows.values()), "
             "'budget': parse_budget(sys.argv[2]).bytes if sys.argv[2] else None}))")


def _estimate(path: Path, budget: str | None) -> dict:
    """The estimate and the parsed budget, from a child: this process imports nothing of srtscope,
    so that its own size never shows in a child's peak RSS (a child starts as a copy of it)."""
    out = subprocess.run([sys.executable, "-c", _ESTIMATE, str(path), budget or ""], check=True,
                         capture_output=True, text=True, cwd=C.ROOT).stdout
    return dict(json.loads(out))


def _run(cmd: list[str], env: dict[str, str] | None = None) -> C.Run:
    r = C.run_wait4(cmd, env=env, timeout=7200)
    what = " ".join(Path(c).name for c in cmd[1:])[:90]
    print(f"#   {what}: {r.wall_s:.2f} s wall, {r.cpu_s:.2f} s CPU ({r.sys_s:.2f} s sys), "
          f"{r.maxrss_mb:.0f} MiB rc={r.rc}", flush=True)
    return r


def _warning(r: C.Run) -> str:
    for w in ((r.out or {}).get("capture") or {}).get("warnings", []):
        if w.get("code") == "window_cut":
            return str(w.get("message", ""))
    return ""


def measure(path: Path, budget: str | None, fill: bool) -> list[list[str]]:
    est = _estimate(path, budget)
    est_mib = est["peak"] / 2**20
    print(f"# {path.name} ({path.stat().st_size / 1e6:.0f} MB, {est['rows'] / 1e6:.2f} M rows): "
          f"estimate {est_mib:.0f} MiB", flush=True)
    rows = []
    diag = [SRTSCOPE, "diagnose", "--json"]
    whole = _run(diag + ["--no-cache", "--memory-budget", "none", str(path)])
    runs = [("whole (--no-cache)", whole)]
    if fill:
        cache = C.CACHE / "memory-budget-cache"
        shutil.rmtree(cache, ignore_errors=True)
        runs.append(("whole, filling the cache", _run(diag + ["--memory-budget", "none", str(path)],
                                                      dict(os.environ, SRTSCOPE_CACHE_DIR=str(cache)))))
        shutil.rmtree(cache, ignore_errors=True)
    for what, r in runs:
        rows.append([path.name, what, f"{r.wall_s:.2f} s", f"{r.cpu_s:.2f} s", f"{r.maxrss_mb:.0f} MiB",
                     f"{est_mib:.0f} MiB", f"{est_mib / r.maxrss_mb:.2f}" if r.rc == 0 else f"rc={r.rc}", ""])
    limit = est["budget"]
    if limit is not None and est["peak"] > limit:
        r = _run(diag + ["--no-cache", "--memory-budget", budget or "", str(path)])
        msg = _warning(r)
        ok = r.rc == 0 and r.maxrss_mb * 2**20 <= limit
        # no window_cut: the whole trace was diagnosed window by window (the same JSON as the whole read)
        what = (msg[:160] if msg else "whole, in windows: JSON " + ("identical" if r.out == whole.out else "DIFFERS")
                ) if r.rc == 0 else f"rc={r.rc} {r.stderr[-200:]}"
        rows.append([path.name, f"--memory-budget {budget}", f"{r.wall_s:.2f} s ({r.wall_s / whole.wall_s:.2f}x)",
                     f"{r.cpu_s:.2f} s", f"{r.maxrss_mb:.0f} MiB", "", "",
                     f"{'within' if ok else 'OVER'} the budget; {what}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="300,1000,3000", help="generated export sizes in MB, comma separated")
    ap.add_argument("--budget", default="2GiB", help="--memory-budget of the windowed runs")
    ap.add_argument("--no-real", action="store_true", help="skip the real traces")
    ap.add_argument("--no-fill", action="store_true", help="skip the cache-filling runs")
    a = ap.parse_args(argv)
    C.banner("memory estimate vs measured peak RSS, and --memory-budget")
    rows: list[list[str]] = []
    for size in [int(x) for x in a.sizes.split(",") if x.strip()]:
        path, _ = generated(size)
        rows += measure(path, a.budget, not a.no_fill)
    if not a.no_real and REAL.is_dir():
        for p in sorted(REAL.glob("*/*")):
            if p.suffix in (".sqlite", ".gz", ".json"):
                rows += measure(p, None, False)
    print()
    print(C.table(["trace", "run", "wall", "CPU", "peak RSS", "estimate", "estimate / peak", "budget"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
