"""``srtscope capture``: run a command under Nsight Systems (then export SQLite) or torch.profiler.

The command's arguments are passed as a list (never through a shell) and its exit code is passed
through (128+N when a signal N ended it). The command runs in its own process group: SIGINT, SIGTERM
and SIGHUP sent to srtscope are forwarded to it, srtscope waits for it (an interrupted capture keeps
what was written), ends what is left of the group (SIGTERM, a grace period, SIGKILL) and exits
128+signal. If srtscope itself dies, even by SIGKILL, the group is ended the same way by its guard
(``child_guard``); the child also gets SIGTERM from the kernel (Linux's parent-death signal).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from srtscope.cli.capture_env import boot_dir, engine_switches, interpreter_of, preflight, split_python
from srtscope.cli.child_guard import Guard, end_group
from srtscope.cli.errors import Exit, fail
from srtscope.cli.output import OutputError, check_output_path, ensure_dir, file_mode
from srtscope.probes.capture_boot import process_trace_path
from srtscope.probes.flush_request import FlushRequest
from srtscope.probes.torch_capture import TORCH_PROFILE_ENV, rank_trace_path, rank_traces

NSYS_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")  # stripped from --out to name the capture


class Backend(str, Enum):
    NSYS = "nsys"
    TORCH = "torch"
    PROBE = "probe"      # no profiler: the instrumented stages' spans, as srtscope probe traces


class Engine(str, Enum):
    """Engines ``--instrument`` knows (``probes/engine_tables.py``)."""

    VLLM = "vllm"
    SGLANG = "sglang"


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


def torch_trace_path(out: Path) -> Path:
    """``--out`` of the torch backend: NAME -> NAME.json.gz; ``.json`` / ``.json.gz`` kept."""
    return out if out.name.endswith((".json", ".json.gz")) else out.with_name(out.name + ".json.gz")


def torch_plan(out: Path, command: list[str],
               env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str], Path]:
    """Command and environment for the torch.profiler backend; returns (argv, env, trace path).

    A Python command (``python [OPTIONS] script.py ...`` or ``python -m mod ...``) runs under
    ``srtscope.cli.torch_profile`` in the interpreter it names, which wraps the script in
    torch.profiler. Any other command (e.g. ``srtscope run``) gets ``SRTSCOPE_TORCH_PROFILE`` and
    profiles itself if it knows how.
    """
    trace = torch_trace_path(out)
    env = dict(os.environ) if env is None else env
    py = split_python(command)
    if py is not None:
        argv = [py.python, *py.options, "-m", "srtscope.cli.torch_profile", "--out", str(trace),
                "--", *py.target]
    else:
        env[TORCH_PROFILE_ENV] = str(trace)
        argv = list(command)
    return argv, env, trace


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.1     # while a signal is held back: how often the traces' progress is looked at
KILL_AFTER = 3   # the third forwarded signal SIGKILLs the child's group (a child that will not end)
_PR_SET_PDEATHSIG = 1


@dataclass
class ChildRun:
    """How a child ended: ``code`` is its exit status (128+N when killed by signal N);
    ``signal`` the first signal srtscope received and forwarded while it ran (0: none)."""

    code: int
    signal: int = 0


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when srtscope dies (even by SIGKILL);
    None where prctl is unavailable. A child that ignores SIGTERM, and the rest of its group, are
    ended by the group's guard. NOTE: the signal follows the death of the forking *thread*: ``_run``
    forks and then waits in that same thread until the child has exited."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:      # srtscope died before prctl: end now
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _run(argv: list[str], env: dict[str, str] | None = None, request: FlushRequest | None = None) -> ChildRun:
    """Run a child in its own session and process group; SIGINT, SIGTERM and SIGHUP sent to srtscope
    are forwarded to that group (the third one SIGKILLs it) and srtscope waits for the child, so it
    can flush its trace. With ``request``, the first signal is held back while the processes that
    profile themselves write their traces (``FlushRequest``: at most its ``wait_s``; a second signal
    goes on at once). After a forwarded signal, or an error, what is left of the group is ended
    (``end_group``); a guard does the same if srtscope dies first: no orphans."""
    in_main = threading.current_thread() is threading.main_thread()
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent())
    except FileNotFoundError:
        fail(f"command not found: {argv[0]}")
    except PermissionError:
        fail(f"command not executable: {argv[0]}")
    except OSError as exc:              # e.g. ENOEXEC: a file that is not a program
        fail(f"cannot run {argv[0]}: {exc.strerror or exc}")
    got: list[int] = []
    held: list[int] = []                 # a first signal held back while the traces are written
    guard = Guard(proc.pid)

    def forward(signum: int, frame: object) -> None:
        got.append(signum)
        if len(got) == 1 and request is not None:
            asked = request.ask()
            if asked:
                held.append(signum)
                print(f"srtscope: asking {asked} profiled process{'es' if asked > 1 else ''} to write "
                      f"{'their traces' if asked > 1 else 'its trace'} before passing {signal.Signals(signum).name} "
                      f"on (at most {request.wait_s:g} s; again to pass it on now)", file=sys.stderr)
                return
        held.clear()
        _signal_group(proc.pid, signal.SIGKILL if len(got) >= KILL_AFTER else signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED} if in_main else {}
    try:
        while True:
            try:
                # NOTE: polled with a request: a signal handler cannot end a blocking wait
                status = proc.wait(timeout=POLL_S) if request is not None else proc.wait()
                break
            except subprocess.TimeoutExpired:
                if held and request is not None and request.settled():
                    _signal_group(proc.pid, held.pop())
            except KeyboardInterrupt:            # only where no handler could be installed
                forward(signal.SIGINT, None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if got or proc.returncode is None:       # interrupted, or an error: what is left of the group
            end_group(proc.pid)
        guard.release()
    code = 128 - status if status < 0 else status
    return ChildRun(code, got[0] if got else 0)


def capture(command: list[str], backend: Backend, out: Path, capture_range: bool = False,
            instrument: list[Engine] | None = None) -> int:
    """Run ``command`` under the chosen backend; returns the command's exit code. ``instrument``:
    engines whose functions are wrapped in stage ranges in every Python process of the command."""
    if not command:
        fail("capture needs a command after '--', e.g. srtscope capture -- python serve.py")
    engines = list(dict.fromkeys(e.value for e in instrument or []))
    if backend is Backend.PROBE and not engines:
        fail("--backend probe records only the engine functions that --instrument wraps: "
             "add --instrument vllm or --instrument sglang")
    split_python(command)               # an incomplete Python command is refused before anything runs
    try:
        ensure_dir(out.parent, "--out folder")
    except OutputError as exc:
        fail(str(exc))
    env = dict(os.environ)
    engine_switches(env, nsys=backend is Backend.NSYS)
    python = interpreter_of(command)
    if backend is Backend.NSYS:
        nsys = shutil.which("nsys")
        if nsys is None:
            fail("nsys (Nsight Systems) is not installed or not on PATH; " + (
                "use --backend probe (the --instrument stages' own spans, no profiler) or --backend torch "
                "(a torch.profiler trace with them)" if engines else
                "use --backend torch to capture with torch.profiler instead"))
        plan = nsys_plan(nsys, out, command, capture_range)
        _check_outputs([plan.report, plan.sqlite])
        with boot_dir(env, backend.value, plan.report, engines) if engines else nullcontext():
            if engines and python is not None:
                preflight(python, env, ["srtscope.probes.capture_boot"])
            run = _run(plan.profile, env)
        if plan.report.exists():
            exported = _run(plan.export)
            if exported.signal:
                return _interrupted(exported.signal)
            if exported.code != 0:
                fail(f"nsys export failed with exit code {exported.code} for {plan.report}", Exit.INTERNAL)
            print(f"srtscope: wrote {plan.sqlite}", file=sys.stderr)
        else:
            print(f"srtscope: nsys wrote no report ({plan.report} missing)", file=sys.stderr)
        return _interrupted(run.signal) if run.signal else run.code
    if backend is Backend.TORCH:
        argv, env, trace = torch_plan(out, command, env)
        _check_outputs([trace, rank_trace_path(trace, 0)])
        modules = ["srtscope.cli.torch_profile"] if split_python(command) is not None else []
    else:
        argv, trace = list(command), out
        modules = []
    if engines:
        modules.append("srtscope.probes.capture_boot")
    t0 = time.time()
    with boot_dir(env, backend.value, trace, engines) if modules else nullcontext() as folder:
        if modules and python is not None:
            preflight(python, env, modules)
        # a server's processes profiling themselves write their traces before a signal reaches them
        request = FlushRequest(folder) if folder is not None and engines and backend is Backend.TORCH else None
        run = _run(argv, env, request)
    since = t0 - 1.0   # NOTE: file systems with coarse timestamps
    fresh = [p for p in [trace] if backend is Backend.TORCH and p.exists() and p.stat().st_mtime >= since]
    if backend is Backend.TORCH:
        fresh += rank_traces(trace, since)
    per_process = _process_traces(trace, since)
    for p in per_process:               # written by the command's processes with mkstemp's 0600
        _user_mode(p)
    fresh += per_process
    for written in fresh:
        print(f"srtscope: wrote {written}", file=sys.stderr)
    if backend is Backend.PROBE and per_process:
        _merge_processes(per_process, out)
    if not fresh and backend is Backend.TORCH:
        print(f"srtscope: no Kineto trace was written ({trace} missing)", file=sys.stderr)
    elif not fresh:
        print("srtscope: no probe trace was written: no instrumented engine function ran",
              file=sys.stderr)
    return _interrupted(run.signal) if run.signal else run.code


def _merge_processes(paths: list[Path], out: Path) -> None:
    """The processes' probe traces as one, ``NAME.json.gz`` (when there are several): an engine's
    scheduler and its model runner in different processes (a server) make one rank's steps only
    together. One note line per process killed before its exit flush (SGLang's scheduler at
    ``Engine.shutdown``): its trace, merged too, ends at its last periodic flush."""
    from srtscope.probes.export import atomic_write_json, merge_probe_documents, read_probe_stream

    merged = torch_trace_path(out)
    try:
        streams = [read_probe_stream(p) for p in paths]
    except (OSError, ValueError, KeyError) as exc:
        print(f"srtscope: the {len(paths)} processes' traces were not read: {exc}", file=sys.stderr)
        return
    notes = [note for p, st in zip(paths, streams) if (note := st.note(p))]
    for note in notes:
        print(f"srtscope: note: {note}", file=sys.stderr)
    if len(paths) < 2:
        return
    doc = merge_probe_documents([st.doc for st in streams])
    if notes:
        doc["meta"]["ended_early"] = notes      # diagnose says it too (warning ended_early)
    try:
        check_output_path(merged)
        atomic_write_json(merged, doc)
        _user_mode(merged)
    except (OutputError, OSError, ValueError, KeyError) as exc:
        print(f"srtscope: the {len(paths)} processes' traces were not merged: {exc}", file=sys.stderr)
        return
    print(f"srtscope: wrote {merged} (the {len(paths)} processes on one clock: diagnose this one)",
          file=sys.stderr)


def _user_mode(path: Path) -> None:
    """Give a trace the mode the user's umask gives new files, as every other output has."""
    try:
        os.chmod(path, file_mode())
    except OSError:
        pass


def _process_traces(trace: Path, since: float) -> list[Path]:
    """The per-process traces (``process_trace_path``) of ``trace`` written at or after ``since``."""
    pattern = process_trace_path(trace, 0).name.replace(".pid0.", ".pid*.", 1)
    return sorted(p for p in trace.parent.glob(pattern) if p.stat().st_mtime >= since)


def _check_outputs(paths: list[Path]) -> None:
    """The capture's output paths must be absent or regular files (exit 2, one line)."""
    try:
        for p in paths:
            check_output_path(p)
    except OutputError as exc:
        fail(str(exc))


def _interrupted(signum: int) -> int:
    """Say that the capture was interrupted; the exit status for it is 128+signal."""
    print(f"srtscope: interrupted by {signal.Signals(signum).name}; the child has exited", file=sys.stderr)
    return 128 + signum
