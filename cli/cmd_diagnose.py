"""``srtscope diagnose TRACE... [--json] [--markdown FILE] [--perfetto FILE] [--threshold-us N] [--steps A:B]``"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from srtscope.cli.errors import fail
from srtscope.cli.loading import load


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
        hi = int(b) if b.strip() else 2**62
    except ValueError:
        fail(f"--steps {text!r}: A and B must be integers")
    if lo < 0 or hi <= lo:
        fail(f"--steps {text!r}: need 0 <= A < B")
    return lo, hi - 1


def run_diagnosis(paths: list[Path], threshold_us: float, steps: tuple[int, int] | None,
                  console: Console | None, quiet: bool):
    """Load + diagnose; returns the Diagnosis object."""
    from srtscope.analyzers.diagnose import DiagnoseInputError, DiagnoseParams, diagnose

    tl = load(paths, console, quiet)
    try:
        params = DiagnoseParams(threshold_us=threshold_us, step_range=steps)
    except ValueError as exc:
        fail(str(exc))
    try:
        return diagnose(tl, params)
    except DiagnoseInputError as exc:
        fail(str(exc))


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
        threshold_us: float = typer.Option(5.0, "--threshold-us", min=0.0,
                                           help="Smallest gap counted as a bubble, in us."),
        steps: str | None = typer.Option(None, "--steps", help="Only steps A:B (B exclusive)."),
    ) -> None:
        """Diagnose traces: verdict (scheduler / prep / kernel), bubbles, steps, communication."""
        console = Console(stderr=as_json)
        diag = run_diagnosis(list(traces), threshold_us, parse_steps(steps), console, as_json)
        doc = diag.to_json()
        if markdown is not None:
            from srtscope.cli.markdown import diagnosis_markdown

            _write_text(markdown, diagnosis_markdown(doc))
        if perfetto is not None:
            from srtscope.cli.perfetto import write_perfetto

            try:
                write_perfetto(diag, perfetto)
            except OSError as exc:
                fail(f"{perfetto}: cannot write: {exc.strerror or exc}")
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        from srtscope.cli.render import render_diagnosis

        render_diagnosis(doc, console)


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        fail(f"{path}: cannot write: {exc.strerror or exc}")
