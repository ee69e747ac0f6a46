"""The libraries a Kineto reader could be built on, side by side on one trace: inflating and decoding.

    .venv/bin/python -m benchmarks.kineto_libs TRACE.json.gz [--runs 3]

Inflate: stdlib ``gzip`` (zlib) against ISA-L (``isal.igzip``). Decode the inflated document whole:
stdlib ``json.loads``, ``orjson.loads`` (when installed: ``pip install orjson``), msgspec untyped,
msgspec typed into structs of the used members only (``kineto_stream.Event``: ``ts`` / ``dur`` as
raw literals), and srtscope's batched reader (``read_kineto_batched``: inflate + decode in blocks +
columns) against its exact streaming reader (``_read_exact``). CPU seconds of this process (best
of ``--runs``; process time, so other work on a shared machine does not blur them) and the peak
memory each step adds (tracemalloc is not used: it slows the decoders; ``ru_maxrss`` grows
monotonically, so each library runs in its own child process).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

STEPS = ["gzip", "isal", "json", "orjson", "msgspec_any", "msgspec_typed", "srtscope_batched", "srtscope_exact"]

_CHILD = r'''
import json, resource, sys, time
from pathlib import Path
step, path = sys.argv[1], Path(sys.argv[2])
def inflate_isal():
    from isal import igzip
    return igzip.open(path, "rb").read()
def cpu():
    return time.process_time()
if step == "gzip":
    import gzip
    t = cpu(); data = gzip.open(path, "rb").read(); dt = cpu() - t
elif step == "isal":
    t = cpu(); data = inflate_isal(); dt = cpu() - t
elif step.startswith("srtscope"):
    from srtscope.analyzers.readers.kineto import read_kineto_batched, _read_exact
    t = cpu(); tl = (read_kineto_batched(path) if step == "srtscope_batched" else _read_exact(path, 0)); dt = cpu() - t
else:
    data = inflate_isal()
    t = cpu()
    if step == "json":
        doc = json.loads(data)
    elif step == "orjson":
        import orjson
        doc = orjson.loads(data)
    elif step == "msgspec_any":
        import msgspec
        doc = msgspec.json.decode(data)
    else:
        import msgspec
        from srtscope.analyzers.readers.kineto_stream import Event
        class Trace(msgspec.Struct):
            traceEvents: list[Event] = []
        doc = msgspec.json.decode(data, type=Trace)
    dt = cpu() - t
print(json.dumps({"cpu_s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def run(step: str, path: Path) -> dict | None:
    r = subprocess.run([sys.executable, "-c", _CHILD, step, str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    best: dict[str, dict] = {}
    t0 = time.time()
    for _ in range(args.runs):
        for step in STEPS:
            got = run(step, args.trace)
            if got is None or "error" in got:
                best.setdefault(step, got or {"error": "?"})
                continue
            if step not in best or "error" in best[step] or got["cpu_s"] < best[step]["cpu_s"]:
                best[step] = got
    print(f"{args.trace} ({args.trace.stat().st_size / 1e6:.0f} MB), best of {args.runs}, "
          f"{time.time() - t0:.0f} s in all; peak RSS of the whole child process")
    for step in STEPS:
        b = best.get(step, {})
        print(f"  {step:18s} " + (b["error"] if "error" in b else f"{b['cpu_s']:7.2f} cpu s  {b['rss_mb']:7.0f} MiB"))
    print(json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
