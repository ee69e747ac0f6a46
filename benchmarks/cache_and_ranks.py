"""First look vs the SQLite floor, second looks (diagnosis, table cache) vs the first, 8 ranks --jobs 2 vs sequential.

    .venv/bin/python benchmarks/cache_and_ranks.py [--trace /tmp/srtscope_1000mb.sqlite] [--size-mb 300]
                                                   [--ranks 8] [--rank-mb 30] [--runs 2]

Each figure is a whole process (interpreter start and imports included), measured with wait4: wall
time (s) and CPU user + system (s), medians over ``--runs`` (peak RSS is left out: wait4's
``ru_maxrss`` came back the same for every run after the first here, so it is not the child's own):
  floor         the sqlite3 shell selecting just the columns srtscope reads into /dev/null
                (single-threaded; the least any SQLite reader pays)
  first look    ``srtscope diagnose --json --no-cache TRACE``
  second look   ``srtscope diagnose --json TRACE`` with the entries in the cache (filled by one timed
                run into a private ``SRTSCOPE_CACHE_DIR`` under $SRTSCOPE_BENCH_CACHE): the same
                question, answered by the diagnosis cache; and other questions (``--threshold-us 6``,
                ``7``, ...), which re-run the analyses over the tables from the table cache
  ranks         ``diagnose --json --no-cache`` on ``--ranks`` generated exports of ~``--rank-mb`` MB
                (one session: ranks of one job), ``--jobs 2`` vs one after another; the JSON must match
Targets (printed, never asserted): first look <= 1.0x the floor's wall and <= 1.4x its CPU; second look
<= 1/5 of the first look's wall; --jobs 2 <= 0.6x the sequential wall. Inputs are generated with
benchmarks/gen_nsys.py under $SRTSCOPE_BENCH_CACHE (default /tmp/srtscope-bench) when missing.
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

from benchmarks.gen_nsys import cached_name  # noqa: E402
from srtscope.analyzers.traces import reading_processes  # noqa: E402

SRTSCOPE = C.ROOT / ".venv" / "bin" / "srtscope"


def _gen(path: Path, mb: float, seed: int = 0) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        subprocess.run([str(C.PROJECT_PY), str(C.ROOT / "benchmarks" / "gen_nsys.py"), "--size-mb", str(mb),
                        "--seed", str(seed), str(tmp)], check=True, cwd=C.ROOT, stdout=subprocess.DEVNULL)
        tmp.rename(path)
    return path


def _series(cmd: list[str], n: int, env: dict[str, str] | None = None, json_out: bool = True) -> C.Series:
    s = C.Series()
    for _ in range(n):
        r = C.run_wait4(cmd, env=env)
        if not json_out and r.rc == 0:
            r.out = {}
        s.runs.append(r)
        print(f"#   {' '.join(cmd[-3:])[:70]}: {r.wall_s:.2f} s (cpu {r.cpu_s:.2f} s) rc={r.rc}", flush=True)
    return s


def _row(what: str, s: C.Series, base: C.Series | None, target: str) -> list[str]:
    return [what, C.fmt_s(s.wall), C.fmt_s(s.cpu),
            C.ratio(base.wall, s.wall) if base else "—", C.ratio(base.cpu, s.cpu) if base else "—", target]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="an nsys export (default: a generated one of --size-mb)")
    ap.add_argument("--size-mb", type=float, default=300)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rank-mb", type=float, default=30)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args(argv)
    print(f"# cache and ranks — {C.cores()}", flush=True)
    trace = a.trace or _gen(C.CACHE / cached_name(a.size_mb), a.size_mb)
    cache = C.CACHE / "table-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, SRTSCOPE_CACHE_DIR=str(cache))
    diag = [str(SRTSCOPE), "diagnose", "--json"]
    print(f"# {trace} ({trace.stat().st_size / 1e6:.0f} MB)", flush=True)
    floor = _series(C.floor_command(trace), a.runs, json_out=False)
    first = _series(diag + ["--no-cache", str(trace)], a.runs, env)
    fill = _series(diag + [str(trace)], 1, env)            # first look that also writes the entries
    second = _series(diag + [str(trace)], a.runs, env)     # the same question: the diagnosis cache
    other = C.Series()                                     # other questions: the table cache, analyses
    for i in range(a.runs):
        other.runs += _series(diag + ["--threshold-us", f"{6 + i}", str(trace)], 1, env).runs
    fresh_other = _series(diag + ["--no-cache", "--threshold-us", f"{5 + a.runs}", str(trace)], 1, env)
    last_other = _series(diag + ["--threshold-us", f"{5 + a.runs}", str(trace)], 1, env)
    same_cache = first.out == second.out == fill.out and fresh_other.out == last_other.out
    size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())

    ranks = [_gen(C.CACHE / f"ranks{a.ranks}x{a.rank_mb:g}mb" / f"rank{i}.sqlite", a.rank_mb, seed=i)
             for i in range(a.ranks)]
    print(f"# {a.ranks} rank files of {ranks[0].stat().st_size / 1e6:.0f} MB", flush=True)
    seq, par = C.Series(), C.Series()
    for _ in range(a.runs):                                  # interleaved
        seq.runs += _series(diag + ["--no-cache", *map(str, ranks)], 1, env).runs
        par.runs += _series(diag + ["--no-cache", "--jobs", "2", *map(str, ranks)], 1, env).runs
    same_ranks = seq.out == par.out

    rows = [_row("sqlite3 shell, needed columns -> /dev/null (floor)", floor, None, "—"),
            _row("first look: diagnose --no-cache", first, floor, "<= 1.0x wall, <= 1.4x CPU of the floor"),
            _row("first look, writing the cache entry", fill, first, "—"),
            _row("second look, same question: diagnosis cache hit", second, first, "<= 0.20x the first look's wall"),
            _row("second look, another --threshold-us: table cache hit", other, first, "—"),
            _row(f"{a.ranks} ranks, one after another", seq, None, "—"),
            _row(f"{a.ranks} ranks, --jobs 2 ({reading_processes(2, a.ranks)} reading process(es) here)", par, seq,
                 "<= 0.60x the sequential wall")]
    print()
    print(C.table(["run", "wall (median)", "CPU user+sys", "/ baseline wall", "/ baseline CPU",
                   "target"], rows))
    print(f"\nbaselines: first look vs the floor; cache-filling and second look vs the first look; --jobs 2 vs "
          f"sequential. Cache entry: {size / 2**20:.0f} MiB. JSON identical with / without the cache: "
          f"{same_cache}; with --jobs 2 / sequential: {same_ranks}")
    C.save_results("cache_and_ranks", {"machine": C.cores(), "trace": str(trace), "cache_bytes": size,
                                       **{k: {"wall_s": s.wall, "cpu_s": s.cpu}
                                          for k, s in (("floor", floor), ("first", first), ("fill", fill),
                                                       ("second", second), ("other_question", other),
                                                       ("ranks_seq", seq),
                                                       ("ranks_jobs2", par))},
                                       "same_cache": same_cache, "same_ranks": same_ranks})
    shutil.rmtree(cache, ignore_errors=True)
    return 0 if same_cache and same_ranks else 1


if __name__ == "__main__":
    sys.exit(main())
