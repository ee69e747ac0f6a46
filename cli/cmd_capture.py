"""``srtscope capture [--backend nsys|torch|probe] [--instrument vllm|sglang] [--out NAME] -- COMMAND...``
and ``srtscope capture --server URL [--load N | --duration S] [--trace-dir DIR]``."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from srtscope.cli.capture import Backend, Engine, capture
from srtscope.cli.errors import fail

DEFAULT_OUT = Path("srtscope_capture")


def register(app: typer.Typer) -> None:
    @app.command("capture", context_settings={"allow_extra_args": True,
                                              "ignore_unknown_options": True})
    def capture_cmd(
        command: list[str] = typer.Argument(None, help="The command to profile, after '--'."),
        backend: Backend | None = typer.Option(None, "--backend", "-b",
                                               help="nsys: Nsight Systems + SQLite export; "
                                                    "torch: torch.profiler Kineto trace; probe: no "
                                                    "profiler, the --instrument stages' own spans. "
                                                    "Default: nsys where it is installed, else probe "
                                                    "with --instrument."),
        out: Path | None = typer.Option(None, "--out", "-o",
                                        help="Output name (NAME.nsys-rep + NAME.sqlite, or "
                                             "NAME.json.gz; NAME.pid<N>.json.gz per other process). "
                                             "Default: srtscope_capture."),
        capture_range: bool = typer.Option(False, "--capture-range",
                                           help="nsys: record only between cudaProfilerStart/Stop."),
        instrument: list[Engine] = typer.Option(
            [], "--instrument", help="Wrap this engine's scheduler, prep, forward, sample and "
                                     "result functions in srtscope stage ranges in every Python "
                                     "process of COMMAND (repeatable)."),
        server: str | None = typer.Option(None, "--server", metavar="URL",
                                          help="Profile a running SGLang / vLLM server through its "
                                               "/start_profile and /stop_profile, then diagnose "
                                               "the trace it wrote (no COMMAND)."),
        load: int = typer.Option(32, "--load", help="--server: built-in requests sent to "
                                                    "/v1/completions while profiling (0: none)."),
        concurrency: int = typer.Option(4, "--concurrency", help="--server: load requests in flight."),
        max_tokens: int = typer.Option(32, "--max-tokens", help="--server: tokens per load request."),
        duration: float = typer.Option(10.0, "--duration", help="--server --load 0: seconds to profile "
                                                                "the server's own traffic."),
        trace_dir: Path | None = typer.Option(None, "--trace-dir",
                                              help="--server: the folder the server writes traces "
                                                   "to (vLLM: its VLLM_TORCH_PROFILER_DIR)."),
        timeout: float = typer.Option(60.0, "--timeout", help="--server: total deadline of each HTTP "
                                                              "call (connect, headers, body), s."),
        wait: float = typer.Option(120.0, "--wait", help="--server: one total deadline from /stop_profile "
                                                         "on (the server writes its trace before "
                                                         "answering; then the files settle), s."),
        probe: Path | None = typer.Option(None, "--probe", metavar="NAME",
                                          help="--server: the -o NAME of the server's own `srtscope capture "
                                               "--backend probe --instrument ENGINE`: its processes' stage "
                                               "spans (the scheduler's process too) are diagnosed."),
        with_stack: bool = typer.Option(False, "--with-stack", help="--server: ask the server's profiler for "
                                                                    "Python stacks (SGLang; slow, large)."),
        diagnose: bool = typer.Option(True, "--diagnose/--no-diagnose",
                                      help="--server: diagnose the trace afterwards."),
    ) -> None:
        """Run COMMAND under a profiler with the flags srtscope's analysis needs, or profile a
        running server (--server).

        COMMAND runs with the interpreter it names; the engines' own profiling switches
        (VLLM_CUSTOM_SCOPES_FOR_PROFILING; under nsys also VLLM_NVTX_SCOPES_FOR_PROFILING and
        SGLANG_ENABLE_NVTX_SCHEDULER) are set unless already set. The command's exit code is
        passed through.
        """
        if server is not None:
            if command:
                fail("--server profiles a running server: give no COMMAND with it")
            if out is not None or instrument or capture_range:
                fail("--out, --instrument and --capture-range apply to a COMMAND, not to --server "
                     "(start the server itself under srtscope capture --backend probe --instrument ENGINE "
                     "-o NAME, then give --probe NAME)")
            raise typer.Exit(_server(server, load, concurrency, max_tokens, duration, trace_dir,
                                     timeout, wait, diagnose, probe, with_stack))
        if probe is not None or with_stack:
            fail("--probe and --with-stack apply to --server")
        code = capture(list(command or []), default_backend(backend, bool(instrument)), out or DEFAULT_OUT,
                       capture_range, list(instrument))
        raise typer.Exit(code)


def default_backend(given: Backend | None, instrument: bool) -> Backend:
    """``--backend`` as given; else nsys where it is on PATH, else (with ``--instrument``) probe,
    said in one line: the instrumented stages need no profiler. Without either, nsys (whose
    absence is then one error line naming the other backends)."""
    import shutil

    if given is not None:
        return given
    if shutil.which("nsys") is None and instrument:
        print("srtscope: nsys is not installed: capturing with --backend probe (the --instrument stages' "
              "own spans; --backend torch for a torch.profiler trace)", file=sys.stderr, flush=True)
        return Backend.PROBE
    return Backend.NSYS


def _server(url: str, load: int, concurrency: int, max_tokens: int, duration: float,
            trace_dir: Path | None, timeout: float, wait: float, diagnose: bool,
            probe: Path | None = None, with_stack: bool = False) -> int:
    from srtscope.cli.http_call import shown
    from srtscope.cli.server_capture import (
        WORKER_ONLY,
        ServerError,
        ServerPlan,
        capture_server,
        engine_traces,
        worker_only,
    )

    try:
        plan = ServerPlan(url, trace_dir, load, concurrency, max_tokens, duration, timeout, wait, probe, with_stack)
    except ValueError as exc:
        fail(str(exc))

    def say(line: str) -> None:
        print(f"srtscope: {line}", file=sys.stderr, flush=True)

    try:
        got = capture_server(plan, say)
    except ServerError as exc:
        fail(str(exc))
    engine, front = engine_traces(got.traces)
    for t in engine:                    # NOTE: the server names its files: escaped, cut
        say(f"the server wrote {shown(t, 1000)}" + (" (not diagnosed: the --probe trace is)" if got.probe else ""))
    for t in front:
        say(f"the server wrote {shown(t, 1000)} (its front end: not diagnosed)")
    chosen = [got.probe] if got.probe is not None else engine
    if not diagnose or not chosen:
        return 0
    from srtscope.cli.cmd_diagnose import run_diagnosis
    from srtscope.cli.render import render_diagnosis
    from srtscope.cli.terminal import Console

    console = Console()
    keep: list = []
    diag = run_diagnosis(chosen, 5.0, None, console, False, keep)
    doc = diag.to_json()
    names = set(keep[0].host_ranges["name"].astype(str)) if keep and keep[0] is not None \
        else {r["name"] for r in doc.get("top_ranges", [])}
    if got.probe is None and worker_only(names):
        say(WORKER_ONLY)
    render_diagnosis(doc, console)
    return 0
