"""``srtscope diagnose TRACE... [--json] [--markdown FILE] [--perfetto FILE] [--threshold-us N] [--steps A:B]``"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from srtscope.cli.contract import SavedDiagnosis
from srtscope.cli.errors import Exit, fail, one_line
from srtscope.cli.loading import check_cluster_jobs, keep_freed_memory, progress_bar
from srtscope.cli.memory_budget import HELP as BUDGET_HELP
from srtscope.cli.memory_budget import Budget, budget_option, parse_budget
from srtscope.cli.output import OutputError, check_output_path, write_text
from srtscope.cli.terminal import Console
from srtscope.cli.values import MAX_THRESHOLD_US, float_option

MAX_STEP = 2**62
MAX_JOBS = 256
CLUSTER_HELP = ("Read the rank files on the Dask cluster at this scheduler address (tcp://host:8786) "
                "instead of here; its workers open the same paths (a shared filesystem) and keep the "
                "table cache on their side. Needs srtscope[cluster]; not with --jobs.")


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``A:B`` (either side may be empty; B exclusive, like a Python slice) -> (first, last)
    inclusive as ``DiagnoseParams.step_range`` takes it; None for no selection."""
    if not text:
        return None
    a, sep, b = text.partition(":")
    if not sep:
        fail(f"--steps {text!r}: expected A:B, e.g. 10:50")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else MAX_STEP
    except ValueError:
        fail(f"--steps {text!r}: A and B must be integers")
    if lo < 0 or hi <= lo:
        fail(f"--steps {text!r}: need 0 <= A < B")
    if hi > MAX_STEP:
        fail(f"--steps {text!r}: B must be at most 2^62")
    return lo, hi - 1


def run_diagnosis(paths: list[Path], threshold_us: float, steps: tuple[int, int] | None,
                  console: Console | None, quiet: bool, keep: list | None = None, cache: bool = True,
                  jobs: int = 1, cluster: str | None = None, reuse: bool = False,
                  budget: Budget | None = None) -> Any:
    """Load + diagnose; returns the Diagnosis object (``keep`` receives the Timeline when given, None
    for a diagnosis in windows). ``cache``: use the user's table cache; ``jobs``: rank files read in
    that many processes; ``cluster``: read by the workers of the Dask scheduler at that address.
    ``reuse`` (with ``cache``): the answer may come from the diagnosis cache, as a ``SavedDiagnosis``
    of the same JSON document, and a new answer is kept there. ``budget``: ``--memory-budget``
    (default ``auto``). How to read is ``analyzers/traces.diagnose_traces``' to decide; here its
    progress is drawn, its notes said and its errors made exit codes (2, out of memory 1)."""
    from srtscope.analyzers.model.params import DiagnoseParams

    try:
        params = DiagnoseParams(threshold_us=threshold_us, step_range=steps)
    except ValueError as exc:
        fail(str(exc))
    if cache:
        from srtscope.analyzers.cache.cache_store import CacheSettingError, check_settings

        try:
            check_settings()
        except CacheSettingError as exc:
            fail(str(exc))
    key = _diagnosis_key(paths, params) if reuse and cache and keep is None and cluster is None else None
    if key is not None:
        from srtscope.analyzers.cache.result_cache import get_diagnosis
        from srtscope.cli.contract import check

        doc = get_diagnosis(key, check)     # an answer the contract refuses is recomputed
        if doc is not None:
            return SavedDiagnosis(doc)      # NOTE: no numpy, pandas or analyses imported on this path
    from srtscope.analyzers.diagnose import DiagnoseInputError
    from srtscope.analyzers.pipeline.memory_plan import BudgetError
    from srtscope.analyzers.readers import TraceError
    from srtscope.analyzers.readers.cluster import ClusterError
    from srtscope.analyzers.spill.spill_folder import Ended, check_ended
    from srtscope.analyzers.traces import OutOfMemory, ReadHooks, SpillError, diagnose_traces

    if not paths:
        fail("no trace given")
    check_cluster_jobs(cluster, jobs)
    keep_freed_memory()                 # before any reading thread starts (one arena for them all)
    budget = budget if budget is not None else parse_budget("auto")
    try:
        with progress_bar(console, quiet) as bar:
            got = diagnose_traces(paths, params, budget.bytes, cache=cache, jobs=jobs, cluster=cluster,
                                  hooks=ReadHooks(progress=bar, note=_note, check=check_ended),
                                  timeline=keep is not None)
    except (TraceError, BudgetError, DiagnoseInputError, ClusterError, SpillError) as exc:
        fail(str(exc))
    except OutOfMemory as exc:
        fail(str(exc), Exit.INTERNAL)
    except Ended as exc:
        print(f"srtscope: interrupted ({exc.name})", file=sys.stderr)
        raise SystemExit(128 + exc.signum) from None
    if keep is not None:
        keep.append(got.timeline)
    return got.diagnosis if key is None or got.cut else _saved(key, got.diagnosis)


def _note(line: str) -> None:
    """A note of the read, on stderr."""
    print(f"srtscope: note: {line}", file=sys.stderr)


def _saved(key: dict, diag: Any) -> Any:
    """``diag`` kept in the diagnosis cache under ``key``, as the cached answer will read."""
    from srtscope.analyzers.cache.result_cache import put_diagnosis

    # NOTE: rendered from its JSON text, as a cached answer will be: the first and the second look
    # print the same
    return SavedDiagnosis(put_diagnosis(key, json.loads(json.dumps(diag.to_json()))))


def _diagnosis_key(paths: list[Path], params: Any) -> dict | None:
    """The diagnosis cache's key, or None where the table cache would not keep these files either
    (all small: their analyses are quick)."""
    from srtscope.analyzers.cache.cache_store import cache_enabled_for
    from srtscope.analyzers.cache.result_cache import diagnosis_key

    if not any(cache_enabled_for(p) for p in paths):
        return None
    return diagnosis_key(paths, asdict(params))


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose_cmd(
        traces: list[Path] = typer.Argument(..., help="nsys .sqlite, Kineto .json(.gz) or srtscope "
                                                      "probe traces; several = one per rank."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON contract only."),
        markdown: Path | None = typer.Option(None, "--markdown", help="Also write a Markdown report."),
        perfetto: Path | None = typer.Option(None, "--perfetto",
                                                help="Also write a Perfetto trace with bubbles "
                                                     "as slices coloured by cause."),
        perfetto_kernels: bool = typer.Option(False, "--perfetto-kernels",
                                              help="With --perfetto: also every kernel and copy "
                                                   "(large for big traces)."),
        html: Path | None = typer.Option(None, "--html", help="Also write a self-contained HTML "
                                                              "report (plots; opens offline)."),
        threshold_us: float = typer.Option(5.0, "--threshold-us",
                                           callback=float_option(0.0, MAX_THRESHOLD_US, "us"),
                                           help="Smallest gap counted as a bubble, in us "
                                                "(0..1e9)."),
        steps: str | None = typer.Option(None, "--steps", help="Only steps A:B (B exclusive)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Read the traces in full; neither use "
                                                                "nor fill the table cache."),
        jobs: int = typer.Option(1, "--jobs", min=1, max=MAX_JOBS,
                                 help="Read rank files in this many processes (1..256)."),
        cluster: str | None = typer.Option(None, "--cluster", metavar="ADDRESS", help=CLUSTER_HELP),
        full: bool = typer.Option(False, "--full", help="Print every table (the default is one "
                                                        "screen: verdict, what-ifs, the main tables)."),
        memory_budget: str = typer.Option("auto", "--memory-budget", metavar="SIZE",
                                             callback=budget_option, help=BUDGET_HELP),
    ) -> None:
        """Diagnose traces: verdict (scheduler / prep / kernel), bubbles, steps, communication."""
        check_cluster_jobs(cluster, jobs)
        for target in (markdown, perfetto, html):
            if target is not None:
                try:
                    check_output_path(target)       # refused before the (long) read, not after
                except OutputError as exc:
                    fail(str(exc))
        console = Console(stderr=as_json)
        kept: list = []
        # --perfetto draws from the Timeline and the Diagnosis object: those runs are not answered
        # from the diagnosis cache (``keep`` turns it off)
        diag = run_diagnosis(list(traces), threshold_us, parse_steps(steps), console, as_json,
                             kept if perfetto is not None else None, cache=not no_cache, jobs=jobs,
                             cluster=cluster, reuse=True, budget=parse_budget(memory_budget))
        doc = diag.to_json()
        title = "srtscope diagnosis: " + ", ".join(p.name for p in traces[:3]) + (" …" if len(traces) > 3 else "")
        errors = write_outputs(doc, diag, markdown=markdown, html=html, perfetto=perfetto,
                               timeline=kept[0] if kept else None, kernels=perfetto_kernels, title=title)
        if perfetto is not None and perfetto_kernels and kept == [None]:
            print("srtscope: note: --perfetto-kernels: the trace was diagnosed in windows (over "
                  "--memory-budget): its device activity is not drawn", file=sys.stderr)
        if perfetto is not None and perfetto_kernels and kept and kept[0] is not None:
            from srtscope.cli.perfetto import device_counts

            written, total = device_counts(kept[0])
            if written < total:
                print(f"srtscope: note: --perfetto-kernels wrote the first {written:,} of {total:,} device "
                      "activities (the cap; otherData.device_events says so in the file)", file=sys.stderr)
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            from srtscope.cli.render import render_diagnosis

            render_diagnosis(doc, console, full=full)
        report_output_errors(errors)


def write_outputs(doc: dict, diag: Any, *, markdown: Path | None = None, html: Path | None = None,
                  perfetto: Path | None = None, timeline: Any = None, kernels: bool = False,
                  title: str = "srtscope diagnosis") -> list[tuple[Exit, str]]:
    """Write each asked-for file; one that fails does not stop the others. Returns one
    ``(exit code, line)`` per failure, the line naming the option and the file. ``timeline``: the
    source's clock for ``perfetto`` (and its device activity with ``kernels``)."""
    def _html() -> object:
        from srtscope.cli.html import diagnosis_html

        return write_text(html, diagnosis_html(doc, title))  # type: ignore[arg-type]

    def _markdown() -> object:
        from srtscope.cli.markdown import diagnosis_markdown

        return write_text(markdown, diagnosis_markdown(doc))  # type: ignore[arg-type]

    def _perfetto() -> object:
        from srtscope.cli.perfetto import write_perfetto

        return write_perfetto(diag, perfetto, timeline, kernels)  # type: ignore[arg-type]

    errors: list[tuple[Exit, str]] = []
    for option, path, write in (("--html", html, _html), ("--markdown", markdown, _markdown),
                                ("--perfetto", perfetto, _perfetto)):
        if path is None:
            continue
        try:
            write()
        except OutputError as exc:
            errors.append((Exit.BAD_INPUT, f"{option}: {exc}"))
        except OSError as exc:
            errors.append((Exit.BAD_INPUT, f"{option}: {path}: cannot write: {exc.strerror or exc}"))
        except Exception as exc:  # noqa: BLE001 - one output's bug must not cost the others
            if os.environ.get("SRTSCOPE_DEBUG"):
                raise
            errors.append((Exit.INTERNAL, f"{option}: {path}: not written: internal error: "
                                          f"{type(exc).__name__}: {exc}"))
    return errors


def report_output_errors(errors: list[tuple[Exit, str]]) -> None:
    """One stderr line per output not written; exit with the worst code (internal 1 over bad input 2)."""
    if not errors:
        return
    for _, line in errors:
        print(f"srtscope: error: {one_line(line)}", file=sys.stderr)
    raise typer.Exit(int(Exit.INTERNAL if any(c == Exit.INTERNAL for c, _ in errors) else Exit.BAD_INPUT))
