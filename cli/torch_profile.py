"""Run a Python script or module under torch.profiler and write its Kineto trace.

    python -m srtscope.cli.torch_profile --out trace.json.gz -- script.py ARGS...
    python -m srtscope.cli.torch_profile --out trace.json.gz -- -m package.module ARGS...
    python -m srtscope.cli.torch_profile --out trace.json.gz -- -c "CODE" ARGS...

The trace is written when the script ends, raises, calls sys.exit, or is interrupted (SIGINT,
SIGTERM or SIGHUP: exit 128+signal; later signals are ignored while the trace is written), so an
interrupted capture keeps what was recorded. The script's exit code is kept.
Processes the script spawns that know how (tensor-parallel ranks of ours) profile themselves into
``OUT.rank<N>.json.gz``; then the launcher's own trace is not written.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

from srtscope.probes.capture_boot import BOOT_ENV
from srtscope.probes.engine_tables import ENGINES
from srtscope.probes.torch_capture import TORCH_PROFILE_ENV, rank_traces, torch_profiling

_stopped_by: list[int] = []


def _stop(signum: int, frame: object) -> None:
    """The first SIGINT / SIGTERM / SIGHUP unwinds the script like Ctrl-C; later ones are ignored so
    the trace is flushed (``srtscope capture`` SIGKILLs on the third)."""
    _stopped_by.append(signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m srtscope.cli.torch_profile")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("target", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        print("srtscope: error: no script to profile", file=sys.stderr)
        return 2
    if target[0] in ("-m", "-c") and (len(target) < 2 or not target[1]):
        # NOTE: refused before the profiler starts, so no empty trace is left behind
        print(f"srtscope: error: {target[0]} needs an argument", file=sys.stderr)
        return 2
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _stop)
    os.environ[TORCH_PROFILE_ENV] = str(args.out)   # for spawned ranks; this process is captured below
    t0 = time.time()
    try:
        # a launcher whose ranks wrote their own traces only waited: its trace is not worth keeping
        with torch_profiling(args.out, skip_export=lambda: bool(rank_traces(args.out, t0 - 1.0))):
            code = _run_target(target)
    except KeyboardInterrupt:          # a signal while the profiler started
        code = _signal_code()
    for line in engines_unseen(set(sys.modules), os.environ.get(BOOT_ENV)):
        print(line, file=sys.stderr)
    return code


def engines_unseen(modules: set[str], boot: str | None) -> list[str]:
    """One note line per engine the command imported whose scheduler runs in a process of its own
    (``EngineTable.scheduler_apart``) and that ``--instrument`` did not name (``boot``: the
    capture's ``BOOT_ENV``): the trace of this process holds none of that engine's steps."""
    try:
        instrumented = set(json.loads(boot).get("instrument") or []) if boot else set()
    except (ValueError, AttributeError):
        instrumented = set()
    return [f"srtscope: note: {t.name} ran its scheduler in a process of its own, which this trace does not "
            f"profile: it holds no {t.name} steps; for them, capture with --instrument {t.name} "
            f"(srtscope capture --backend torch --instrument {t.name} -- ...)"
            for t in ENGINES.values() if t.scheduler_apart and t.package in modules and t.name not in instrumented]


def _signal_code() -> int:
    return 128 + (_stopped_by[0] if _stopped_by else signal.SIGINT)


def _run_target(target: list[str]) -> int:
    """Run the script, module or code of ``target``; its exit status (128+N when signal N stopped it)."""
    try:
        if target[0] == "-m":
            sys.argv = target[1:]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        elif target[0] == "-c":
            sys.argv = ["-c", *target[2:]]
            exec(compile(target[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = target
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        return _signal_code()
    return 0

if __name__ == "__main__":
    sys.exit(main())
