"""Run a Python script or module under torch.profiler and write its Kineto trace.

    python -m cli.torch_profile --out trace.json.gz -- script.py ARGS...
    python -m cli.torch_profile --out trace.json.gz -- -m package.module ARGS...

The trace is written when the script ends, raises, calls sys.exit, or is interrupted (Ctrl-C /
SIGTERM), so an interrupted capture keeps what was recorded. The script's exit code is kept.
"""
from __future__ import annotations

import argparse
import runpy
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def torch_profiling(out: Path) -> Iterator[None]:
    """Profile the enclosed block (CPU + CUDA when available) and export a Kineto trace to ``out``.

    Every host thread is profiled (the overlap loop's forward thread too), and srtscope stage ranges
    become ``user_annotation`` events while the block runs.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from probes.ranges import torch_annotations

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=False, with_stack=False,
                   experimental_config=_all_threads_config())
    prof.__enter__()
    torch_annotations(True)
    try:
        yield
    finally:
        torch_annotations(False)
        prof.__exit__(None, None, None)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp.json")
        prof.export_chrome_trace(str(tmp))
        if out.name.endswith(".gz"):
            import gzip
            import shutil

            with open(tmp, "rb") as src, gzip.open(out, "wb", compresslevel=5) as dst:
                shutil.copyfileobj(src, dst)
            tmp.unlink()
        else:
            tmp.replace(out)


def _all_threads_config() -> object | None:
    """Kineto config that profiles threads started by the profiled code (None on older torch,
    where only the calling thread's ops are recorded)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cli.torch_profile")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("target", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        print("srtscope: error: no script to profile", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    code = 0
    with torch_profiling(args.out):
        try:
            if target[0] == "-m":
                if len(target) < 2:
                    print("srtscope: error: -m needs a module name", file=sys.stderr)
                    return 2
                sys.argv = target[1:]
                runpy.run_module(target[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = target
                runpy.run_path(target[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except KeyboardInterrupt:
            code = 130
    return code


if __name__ == "__main__":
    sys.exit(main())
