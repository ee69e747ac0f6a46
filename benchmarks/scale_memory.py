"""Any size on one machine: wall, CPU and peak memory of a diagnosis against the SQLite floor, per export size.

    .venv/bin/python -m benchmarks.scale_memory                   # 1, 3 and 10 GB exports
    .venv/bin/python -m benchmarks.scale_memory --sizes 300,1000 --runs 2
    .venv/bin/python -m benchmarks.scale_memory --sizes 2000 --gpus 2 --budget 700MiB   # two ranks in one export

For each size (MB) an export of ``benchmarks/gen_nsys.py`` (generated once, kept under
$SRTSCOPE_BENCH_CACHE, default /tmp/srtscope-bench; a size whose file would not fit the free disk is
skipped and says so), each figure a whole process (interpreter start and imports included),
measured with wait4 (``peers/common.py``): wall, CPU (user + system, a forked copy's included), the
system part apart (paging and allocation show there), peak RSS (where the diagnosis forks a copy
for its second walk, the peak of both processes' RSS summed, sampled every 20 ms: pages they still
share count twice):
  floor         the sqlite3 shell selecting the columns srtscope reads into /dev/null
  first look    ``srtscope diagnose --json --memory-budget 2GiB --no-cache FILE``: over the budget
                the export is diagnosed whole, window by window (``analyzers/traces.py``)
  filling       the same with the caches on (a fresh, private ``SRTSCOPE_CACHE_DIR``): a first
                look that also keeps the answer in the diagnosis cache
  second look   the same command again: answered from the cache
  whole read    ``--memory-budget none --no-cache``: the whole Timeline in memory, the reference
                (exports up to ``--whole-up-to`` MB: it needs ~1.5x the export's size)
Medians over ``--runs``. The JSON of every srtscope run must be identical (printed). Targets
of issue 27 (printed, never asserted): peak RSS <= 2 GiB at every size; first look <= 1.0x the floor's
wall and <= 1.4x its CPU, system time < 10% of its CPU; second look <= 0.2x the first look's wall.
The parent process imports no part of srtscope, so every child's peak RSS is its own.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

from benchmarks.compare_nsys_scale import generated, kernel_count  # noqa: E402
from benchmarks.gen_nsys import cached_name  # noqa: E402


def _mib(budget: str) -> float:
    """``--memory-budget``'s size in MiB, as the command reads it (in a child: this process imports
    no part of srtscope)."""
    code = "import sys; from srtscope.cli.memory_budget import parse_budget; print(parse_budget(sys.argv[1]).bytes)"
    out = subprocess.run([str(C.PROJECT_PY), "-c", code, budget], capture_output=True, text=True, check=True)
    return int(out.stdout) / 2**20


def _series(cmd: list[str], n: int, env: dict[str, str] | None = None, json_out: bool = True) -> C.Series:
    s = C.Series()
    for _ in range(n):
        r = C.run_wait4(cmd, env=env, timeout=7200)
        if not json_out and r.rc == 0:
            r.out = {}
        s.runs.append(r)
        what = " ".join(Path(c).name for c in cmd if not c.startswith((".", "\n")))[:60]
        print(f"#   {what}: {r.wall_s:.2f} s wall, "
              f"{r.cpu_s:.2f} s CPU ({r.sys_s:.2f} s sys), {r.maxrss_mb:.0f} MiB rc={r.rc}", flush=True)
    return s


def _sys(s: C.Series) -> float | None:
    ok = s.ok_runs
    return sorted(r.sys_s for r in ok)[len(ok) // 2] if ok else None


def _fits(size_mb: int, gpus: int = 1) -> bool:
    """The export exists, or it fits the free disk with 2 GB to spare."""
    path = C.CACHE / cached_name(size_mb, gpus)
    if path.exists():
        return True
    C.CACHE.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(C.CACHE).free > size_mb * 1.05e6 + 2e9


def measure(size_mb: int, runs: int, whole_up_to: int, budget: str = "2GiB", gpus: int = 1) -> list[list[str]] | None:
    """The rows of one size (None when its export cannot be made here)."""
    if not _fits(size_mb, gpus):
        print(f"# {size_mb} MB: skipped, not enough free disk under {C.CACHE}", flush=True)
        return None
    path, gen_s = generated(size_mb, gpus)
    nk = kernel_count(path) or 0
    mb = path.stat().st_size / 1e6
    print(f"# {path} ({mb:.0f} MB, {nk / 1e6:.1f} M kernels)"
          f"{'' if gen_s is None else f', generated in {gen_s:.0f} s'}", flush=True)
    cache = C.CACHE / f"scale-memory-cache-{size_mb}"
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, SRTSCOPE_CACHE_DIR=str(cache))
    diag = [str(C.ROOT / ".venv" / "bin" / "srtscope"), "diagnose", "--json", "--memory-budget"]
    floor = _series(C.floor_command(path), runs, json_out=False)
    first = _series(diag + [budget, "--no-cache", str(path)], runs, env)
    fill = _series(diag + [budget, str(path)], 1, env)
    second = _series(diag + [budget, str(path)], runs, env)
    shutil.rmtree(cache, ignore_errors=True)
    # the whole-trace path, the reference the bounded one must equal (it needs ~1.5x the export's size)
    whole = _series(diag + ["none", "--no-cache", str(path)], 1, env) if size_mb <= whole_up_to else None
    same = first.out is not None and first.out == fill.out == second.out and (
        whole is None or whole.out == first.out)
    label = f"{mb:.0f} MB ({nk / 1e6:.1f} M kernels{'' if gpus == 1 else f', {gpus} ranks'})"
    cap = _mib(budget)
    rows = []
    ref = "" if whole is not None else " (no whole run)"
    for what, s, base in (("floor: sqlite3 shell", floor, None),
                          (f"first look, {budget} (--no-cache)", first, floor),
                          (f"first look filling the cache, {budget}", fill, floor),
                          ("second look (cache)", second, first),
                          ("whole-trace read (--memory-budget none)", whole, floor)):
        if s is None:
            continue
        sys_s, cpu = _sys(s), s.cpu
        rows.append([label, what, C.fmt_s(s.wall), C.fmt_s(cpu),
                     "—" if sys_s is None or not cpu else f"{sys_s:.2f} s ({100 * sys_s / cpu:.0f}%)",
                     C.fmt_mb(s.rss), C.ratio(base.wall, s.wall) if base else "—",
                     C.ratio(base.cpu, s.cpu) if base else "—",
                     ("—" if base is None else f"JSON {'identical' if same else 'DIFFERS'}{ref}; "
                      f"RSS {'<=' if (s.rss or 0) <= cap else '>'} {budget}")
                     if s.ok_runs else f"FAILED {s.failure()}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,3000,10000", help="export sizes in MB, comma separated")
    ap.add_argument("--runs", type=int, default=1, help="runs of each measurement (medians)")
    ap.add_argument("--budget", default="2GiB", help="--memory-budget of the bounded looks")
    ap.add_argument("--gpus", type=int, default=1, help="ranks (one GPU each) in each generated export")
    ap.add_argument("--whole-up-to", type=int, default=3000,
                    help="also run the whole-trace read (the JSON reference) on exports up to this size, MB")
    a = ap.parse_args(argv)
    C.banner("diagnosis at scale vs the SQLite floor: wall, CPU, peak RSS")
    rows: list[list[str]] = []
    for size in [int(x) for x in a.sizes.split(",") if x.strip()]:
        rows += measure(size, a.runs, a.whole_up_to, a.budget, a.gpus) or []
    print()
    print(C.table(["export", "run", "wall", "CPU user+sys", "of it system", "peak RSS", "wall / baseline",
                   "CPU / baseline", "check"], rows))
    print("\nbaselines: the floor for first looks, the first look for the second look")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
