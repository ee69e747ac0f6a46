"""``srtscope capture [--backend nsys|torch] [--out NAME] -- COMMAND...``"""
from __future__ import annotations

from pathlib import Path

import typer

from srtscope.cli.capture import Backend, capture


def register(app: typer.Typer) -> None:
    @app.command("capture", context_settings={"allow_extra_args": True,
                                              "ignore_unknown_options": True})
    def capture_cmd(
        command: list[str] = typer.Argument(None, help="The command to profile, after '--'."),
        backend: Backend = typer.Option(Backend.NSYS, "--backend", "-b",
                                        help="nsys: Nsight Systems + SQLite export; "
                                             "torch: torch.profiler Kineto trace."),
        out: Path = typer.Option(Path("srtscope_capture"), "--out", "-o",
                                 help="Output name (NAME.nsys-rep + NAME.sqlite, or NAME.json.gz)."),
        capture_range: bool = typer.Option(False, "--capture-range",
                                           help="nsys: record only between cudaProfilerStart/Stop."),
    ) -> None:
        """Run COMMAND under a profiler with the flags srtscope's analysis needs.

        The command's exit code is passed through.
        """
        code = capture(list(command or []), backend, out, capture_range)
        raise typer.Exit(code)
