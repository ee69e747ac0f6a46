"""Kineto traces with Python stacks: srtscope's first and second look against the library floor and zcat.

    .venv/bin/python -m benchmarks.kineto_floor                       # 1 M, 5 M, 20 M events + vLLM-shaped
    .venv/bin/python -m benchmarks.kineto_floor --events 1000000 6800000 --runs 3 --budget 2GiB

Inputs (``gen_kineto_stacks.py``, cached under $SRTSCOPE_BENCH_CACHE, default /tmp/srtscope-bench):
a GPU-shaped trace of each ``--events`` size (30 Python frames an op: frames, cpu_ops, launches,
flows, kernels) and a vLLM-server-shaped one (``--vllm-events``, 160 frames an op: 97% of its events
``python_function``, as a real vLLM 0.32 capture with stacks). Per trace, side by side, run by run
interleaved, each one whole process measured with wait4 (``peers/common.py``; medians):

  zcat        ``zcat TRACE > /dev/null``: inflating alone
  floor       ``peers/kineto_decode_floor.py``: ISA-L gunzip + msgspec typed decode of traceEvents
              (the whole document at once; only the members srtscope uses)
  first       ``srtscope diagnose --json --no-cache TRACE``: read + diagnose, no cache
  second      ``srtscope diagnose --json TRACE`` after a run that filled a fresh cache
              (``SRTSCOPE_CACHE_DIR``): the result cache's answer
  budget      ``srtscope diagnose --json --no-cache --memory-budget BUDGET TRACE`` (``--budget``;
              only where the trace's estimate passes it)

Wall seconds and CPU seconds (user + system: what the 2 cores, shared with other work, cannot
blur) and peak RSS; ratios first / floor. Printed and saved (``common.save_results``), never asserted.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

SRTSCOPE = str(C.ROOT / ".venv" / "bin" / "srtscope")
GEN = C.ROOT / "benchmarks" / "gen_kineto_stacks.py"
FLOOR = C.PEERS / "kineto_decode_floor.py"


def generated(events: int, frames: int) -> Path:
    """The trace of ``events`` events and ``frames`` frames an op (generated once, then cached)."""
    out = C.CACHE / f"kineto_stacks_{events // 1000}k_f{frames}.json.gz"
    if not out.exists():
        C.CACHE.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".partial")
        r = C.run_wait4([str(C.PROJECT_PY), str(GEN), "--events", str(events), "--frames", str(frames), str(tmp)],
                        timeout=7200)
        if r.rc != 0:
            raise SystemExit(f"gen_kineto_stacks failed: {r.stderr}")
        tmp.rename(out)
    return out


def _env(cache_dir: str | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if cache_dir is not None:
        env["SRTSCOPE_CACHE_DIR"] = cache_dir
    return env


def measure(path: Path, runs: int, budget: str | None) -> dict:
    """Every tool's medians on ``path``."""
    got: dict[str, list[C.Run]] = {k: [] for k in ("zcat", "floor", "first", "second", "budget")}
    for _ in range(runs):
        got["zcat"].append(C.run_wait4(["sh", "-c", f"zcat '{path}' > /dev/null"], env=_env()))
        got["floor"].append(C.run_wait4([str(C.PROJECT_PY), str(FLOOR), str(path)], env=_env()))
        got["first"].append(C.run_wait4([SRTSCOPE, "diagnose", "--json", "--no-cache", str(path)], env=_env()))
        cache = tempfile.mkdtemp(prefix="srtscope-kcache-")
        try:
            C.run_wait4([SRTSCOPE, "diagnose", "--json", str(path)], env=_env(cache))
            got["second"].append(C.run_wait4([SRTSCOPE, "diagnose", "--json", str(path)], env=_env(cache)))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if budget is not None:
            got["budget"].append(C.run_wait4([SRTSCOPE, "diagnose", "--json", "--no-cache", "--memory-budget",
                                              budget, str(path)], env=_env()))
    out: dict = {}
    for k, rs in got.items():
        if not rs:
            continue
        ok = [r for r in rs if r.rc == 0]
        med = sorted(ok, key=lambda r: r.wall_s)[len(ok) // 2] if ok else None
        out[k] = {"wall_s": med.wall_s if med else None, "cpu_s": med.cpu_s if med else None,
                  "rss_mb": med.maxrss_mb if med else None,
                  "failed": "" if len(ok) == len(rs) else (rs[-1].stderr.strip().splitlines() or ["?"])[-1][:200]}
    return out


def _x(a: float | None, b: float | None) -> str:
    """a / b, as "1.23x"."""
    return "-" if not a or not b else f"{a / b:.2f}x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="*", default=[1_000_000, 5_000_000, 20_000_000])
    ap.add_argument("--vllm-events", type=int, default=6_800_000, help="0: no vLLM-shaped trace")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--budget", default="2GiB", help="--memory-budget of the budget run ('' for none)")
    args = ap.parse_args(argv)
    C.banner("Kineto traces with stacks: srtscope vs gunzip + typed decode vs zcat")
    inputs = [(f"GPU-shaped {n / 1e6:g} M", generated(n, 30)) for n in args.events]
    if args.vllm_events:
        inputs.append((f"vLLM-shaped {args.vllm_events / 1e6:g} M", generated(args.vllm_events, 160)))
    rows, results = [], {}
    for label, path in inputs:
        r = measure(path, args.runs, args.budget or None)
        results[label] = {"path": str(path), "bytes": path.stat().st_size, **r}

        def cell(k: str, r: dict = r) -> str:
            m = r.get(k)
            if not m or m["wall_s"] is None:
                return "-" if not m else f"failed: {m['failed']}"
            return f"{m['wall_s']:.1f} s ({m['cpu_s']:.1f} cpu), {m['rss_mb']:.0f} MiB"

        f, fl = r["first"], r["floor"]
        rows.append([label, cell("first"), cell("second"), cell("budget"), cell("floor"), cell("zcat"),
                     _x(f["wall_s"], fl["wall_s"]), _x(f["cpu_s"], fl["cpu_s"]),
                     _x(r.get("second", {}).get("wall_s"), f["wall_s"])])
        print(rows[-1], flush=True)
    print(C.table(["trace", "first look", "second look", f"--memory-budget {args.budget}", "floor", "zcat",
                   "first/floor wall", "first/floor cpu", "second/first"], rows))
    print(C.save_results("kineto_floor", results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
