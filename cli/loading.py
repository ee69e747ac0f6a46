"""Load traces for the CLI: existence checks, a progress bar on large inputs, one-line errors."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from srtscope.cli.errors import Exit, fail

LARGE_BYTES = 50 * 2**20  # show a progress bar from this total input size


def load(paths: list[Path], console: Console | None = None, quiet: bool = False) -> Any:
    """Read one or more trace files into a Timeline; bad input exits 2 with one line."""
    from srtscope.analyzers.readers import TraceError, load_timeline

    if not paths:
        fail("no trace given")
    for p in paths:
        if not p.exists():
            fail(f"{p}: no such file")
        if p.is_dir():
            fail(f"{p}: is a directory, expected a trace file")
    total = sum(p.stat().st_size for p in paths)
    try:
        if quiet or console is None or total < LARGE_BYTES:
            return load_timeline([str(p) for p in paths])
        with Progress(TextColumn("[bold]reading[/] {task.description}"), BarColumn(),
                      TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                      console=console, transient=True) as prog:
            task = prog.add_task(", ".join(p.name for p in paths)[:40], total=1.0)

            def progress(fraction: float, what: str = "") -> None:
                prog.update(task, completed=max(0.0, min(1.0, fraction)))

            return load_timeline([str(p) for p in paths], progress=progress)
    except TraceError as exc:
        fail(str(exc))
    except MemoryError:
        fail(f"out of memory while reading {', '.join(map(str, paths))}", Exit.INTERNAL)
