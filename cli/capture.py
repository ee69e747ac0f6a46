"""``srtscope capture``: run a command under Nsight Systems (then export SQLite) or torch.profiler.

The command's arguments are passed as a list (never through a shell) and its exit code is passed
through. An interrupted capture keeps what was written.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from srtscope.cli.errors import Exit, fail
from srtscope.probes.torch_capture import TORCH_PROFILE_ENV, rank_traces

NSYS_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")  # stripped from --out to name the capture


class Backend(str, Enum):
    NSYS = "nsys"
    TORCH = "torch"


@dataclass(frozen=True)
class NsysPlan:
    """The two nsys invocations of a capture; ``report`` is NAME.nsys-rep, ``sqlite`` NAME.sqlite."""

    profile: list[str]
    export: list[str]
    report: Path
    sqlite: Path


def nsys_plan(nsys: str, out: Path, command: list[str], capture_range: bool = False,
              extra: list[str] | None = None) -> NsysPlan:
    """The flags this analysis needs: CUDA + NVTX + OS runtime, graph kernels traced per node.

    ``out`` names the capture: NAME, NAME.nsys-rep or NAME.sqlite all give NAME.nsys-rep and
    NAME.sqlite. NOTE: any other dot stays part of NAME (``run.v2`` -> ``run.v2.nsys-rep``), as nsys
    itself only appends its extension.
    """
    base = out.with_suffix("") if out.suffix in NSYS_SUFFIXES else out
    report = base.with_name(base.name + ".nsys-rep")
    sqlite = base.with_name(base.name + ".sqlite")
    profile = [nsys, "profile", "--trace=cuda,nvtx,osrt", "--cuda-graph-trace=node",
               "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
               f"--output={report}"]
    if capture_range:
        profile += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    profile += list(extra or [])
    profile += list(command)
    export = [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={sqlite}",
              str(report)]
    return NsysPlan(profile, export, report, sqlite)


def torch_plan(out: Path, command: list[str]) -> tuple[list[str], dict[str, str], Path]:
    """Command and environment for the torch.profiler backend; returns (argv, env, trace path).

    A Python command (``python script.py ...`` or ``python -m mod ...``) runs under
    ``srtscope.cli.torch_profile``, which wraps the script in torch.profiler. Any other command (e.g.
    ``srtscope run``) gets ``SRTSCOPE_TORCH_PROFILE`` and profiles itself if it knows how.
    """
    trace = out if out.name.endswith((".json", ".json.gz")) else out.with_name(out.name + ".json.gz")
    env = dict(os.environ)
    exe = Path(command[0]).name
    if exe.startswith("python") and len(command) > 1:
        argv = [sys.executable, "-m", "srtscope.cli.torch_profile", "--out", str(trace), "--", *command[1:]]
    else:
        env[TORCH_PROFILE_ENV] = str(trace)
        argv = list(command)
    return argv, env, trace


def _run(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run a child, forwarding Ctrl-C to it and waiting for it to finish writing."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        fail(f"command not found: {argv[0]}")
    except PermissionError:
        fail(f"command not executable: {argv[0]}")
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def capture(command: list[str], backend: Backend, out: Path, capture_range: bool = False) -> int:
    """Run ``command`` under the chosen backend; returns the command's exit code."""
    if not command:
        fail("capture needs a command after '--', e.g. srtscope capture -- python serve.py")
    out.parent.mkdir(parents=True, exist_ok=True)
    if backend is Backend.NSYS:
        nsys = shutil.which("nsys")
        if nsys is None:
            fail("nsys (Nsight Systems) is not installed or not on PATH; "
                 "use --backend torch to capture with torch.profiler instead")
        plan = nsys_plan(nsys, out, command, capture_range)
        code = _run(plan.profile)
        if plan.report.exists():
            exported = _run(plan.export)
            if exported != 0:
                fail(f"nsys export failed with exit code {exported} for {plan.report}", Exit.INTERNAL)
            print(f"srtscope: wrote {plan.sqlite}", file=sys.stderr)
        else:
            print(f"srtscope: nsys wrote no report ({plan.report} missing)", file=sys.stderr)
        return code
    argv, env, trace = torch_plan(out, command)
    t0 = time.time()
    code = _run(argv, env)
    since = t0 - 1.0   # NOTE: file systems with coarse timestamps
    fresh = [p for p in [trace] if p.exists() and p.stat().st_mtime >= since] + rank_traces(trace, since)
    for written in fresh:
        print(f"srtscope: wrote {written}", file=sys.stderr)
    if not fresh:
        print(f"srtscope: no Kineto trace was written ({trace} missing)", file=sys.stderr)
    return code
