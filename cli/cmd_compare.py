"""``srtscope compare BEFORE AFTER [--fail-on-regression PCT] [--figure NAME ...] [--json]
[--markdown FILE] [--html FILE]``

BEFORE / AFTER: a trace (or several, comma-separated, one per rank) or a saved ``--json`` diagnosis.
Exit 3 when a chosen figure got worse by more than PCT percent.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from srtscope.analyzers.analyses.diff import DEFAULT_MIN_CHANGE_NS
from srtscope.cli import contract, escape
from srtscope.cli.cmd_diagnose import CLUSTER_HELP, report_output_errors
from srtscope.cli.contract import MAX_SAVED_BYTES, SavedDiagnosis
from srtscope.cli.errors import Exit, fail
from srtscope.cli.loading import check_cluster_jobs, check_input_file
from srtscope.cli.memory_budget import HELP as BUDGET_HELP
from srtscope.cli.memory_budget import budget_option, parse_budget
from srtscope.cli.output import OutputError, check_output_path, write_text
from srtscope.cli.terminal import Console
from srtscope.cli.values import MAX_REGRESSION_PCT, MAX_THRESHOLD_US, float_option


def _saved(path: Path) -> SavedDiagnosis | None:
    """The saved diagnosis in ``path``; None when it is not one (e.g. a trace). A JSON object that
    claims to be a diagnosis but breaks the contract (NaN, missing keys, float ``_ns``) exits 2."""
    if path.suffix != ".json" or path.stat().st_size > MAX_SAVED_BYTES:
        return None
    try:
        doc = contract.parse(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    if not contract.looks_like_diagnosis(doc):
        return None
    try:
        return SavedDiagnosis(contract.check(doc))
    except contract.ContractError as exc:
        fail(f"{path}: not a saved diagnosis of the JSON contract: {exc}")


def _diagnosis(arg: str, threshold_us: float, console: Console, cache: bool = True, jobs: int = 1,
               cluster: str | None = None, budget: str = "auto") -> Any:
    from srtscope.cli.cmd_diagnose import run_diagnosis

    paths = [Path(p) for p in arg.split(",") if p]
    if not paths:
        fail(f"{arg!r}: no trace given")
    for p in paths:
        if cluster is None or p.exists():       # with --cluster, the workers check what is not here
            check_input_file(p)
    if len(paths) == 1 and paths[0].is_file():
        saved = _saved(paths[0])
        if saved is not None:
            return saved
    return run_diagnosis(paths, threshold_us, None, console, True, cache=cache, jobs=jobs, cluster=cluster,
                         reuse=True, budget=parse_budget(budget))


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare_cmd(
        before: str = typer.Argument(..., help="Baseline trace(s) (comma-separated ranks) or saved "
                                               "diagnosis JSON."),
        after: str = typer.Argument(..., help="New trace(s) or saved diagnosis JSON."),
        fail_on_regression: float | None = typer.Option(
            None, "--fail-on-regression", metavar="PCT", callback=float_option(0.0, MAX_REGRESSION_PCT, "%"),
            help="Exit 3 when a gated figure got worse by more than PCT percent (0..1e6) and by at "
                 "least --min-change-us per step; an improvement never fails."),
        figure: list[str] = typer.Option([], "--figure", metavar="NAME",
                                         help="The figure to gate, by its printed name ('mean step') or "
                                              "JSON key (repeatable); default: the mean step."),
        min_change_us: float = typer.Option(DEFAULT_MIN_CHANGE_NS / 1000, "--min-change-us", metavar="US",
                                            callback=float_option(0.0, MAX_THRESHOLD_US, "us"),
                                            help="A time figure's change counts only past this many us per "
                                                 "step as well (0..1e9)."),
        as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON only."),
        threshold_us: float = typer.Option(5.0, "--threshold-us",
                                           callback=float_option(0.0, MAX_THRESHOLD_US, "us"),
                                           help="Smallest gap counted as a bubble, in us (0..1e9)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Read the traces in full; neither use "
                                                                "nor fill the table cache."),
        jobs: int = typer.Option(1, "--jobs", min=1, max=256,
                                 help="Read rank files in this many processes (1..256)."),
        cluster: str | None = typer.Option(None, "--cluster", metavar="ADDRESS", help=CLUSTER_HELP),
        markdown: Path | None = typer.Option(None, "--markdown", help="Also write the comparison as Markdown."),
        html: Path | None = typer.Option(None, "--html", help="Also write the comparison as an HTML page."),
        memory_budget: str = typer.Option("auto", "--memory-budget", metavar="SIZE", callback=budget_option,
                                          help=BUDGET_HELP + " Each side is diagnosed within it."),
    ) -> None:
        """Diagnose two captures: what got better or worse and why, figures by impact, kernels and
        ranges per step."""
        from srtscope.analyzers.analyses.diff import compare

        check_cluster_jobs(cluster, jobs)
        for target in (markdown, html):
            if target is not None:
                try:
                    check_output_path(target)       # refused before the (long) reads, not after
                except OutputError as exc:
                    fail(str(exc))
        console = Console(stderr=as_json)
        b = _diagnosis(before, threshold_us, console, not no_cache, jobs, cluster, memory_budget)
        a = _diagnosis(after, threshold_us, console, not no_cache, jobs, cluster, memory_budget)
        diff = compare(b, a)
        unknown = [f for f in figure if diff.find(f) is None]
        if unknown:
            fail(f"--figure {unknown[0]!r}: unknown figure; known: "
                 f"{', '.join(sorted(repr(f.label) for f in diff.figures))} (or their JSON keys)")
        calls = [] if fail_on_regression is None else \
            diff.gate(figure, fail_on_regression, round(min_change_us * 1000))
        doc = diff.to_json()
        doc["regressions"] = [c.figure.name for c in calls if c.regressed]
        doc["gate"] = [{"figure": c.figure.name, "label": c.figure.label, "outcome": c.outcome,
                        "change": round(c.change, 3)} for c in calls]
        from srtscope.cli.compare_report import diff_html, diff_markdown, gate_line, render_diff

        floors = (fail_on_regression or 0.0, min_change_us)
        msgs = [gate_line(c, *floors) for c in calls if c.regressed]
        passes = [gate_line(c, *floors) for c in calls if not c.regressed]
        errors = []
        for option, path, make in (("--markdown", markdown, lambda: diff_markdown(doc, msgs)),
                                   ("--html", html, lambda: diff_html(doc, (str(before), str(after)), msgs))):
            if path is not None:
                try:
                    write_text(path, make())
                except OutputError as exc:
                    errors.append((Exit.BAD_INPUT, f"{option}: {exc}"))
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            for line in msgs:                       # on stderr: why the exit code is 3
                console.print(escape.terminal(f"regression: {line}"), style="bold red")
        else:
            render_diff(doc, console, msgs)
        for line in passes:
            console.print(escape.terminal(f"gate passed: {line}"), style="green")
        report_output_errors(errors)
        if msgs:
            raise typer.Exit(int(Exit.REGRESSION))
