"""The ``srtscope`` typer app: run, capture, diagnose, compare.

Exit codes: 0 success; 2 bad input (one line on stderr); 3 regression (compare); 1 internal error.
"""
from __future__ import annotations

import os
import sys
from importlib import metadata

import typer

from srtscope.cli.errors import Exit

app = typer.Typer(
    name="srtscope",
    help="Why is my GPU idle, and whose fault is it: the scheduler, batch preparation, or the kernels?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version() -> str:
    try:
        return metadata.version("srtscope")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"srtscope {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version_callback,
                                      is_eager=True, help="Print the version and exit."),
) -> None:
    """srtscope: profiling and bottleneck diagnosis for LLM inference engines."""


def _register() -> None:
    from srtscope.cli import cmd_capture, cmd_compare, cmd_diagnose, cmd_run

    for mod in (cmd_run, cmd_capture, cmd_diagnose, cmd_compare):
        mod.register(app)


_register()


def main() -> None:
    """Console entry point: user errors exit 2 (one line), internal errors exit 1.

    An internal error prints one line naming the exception; ``SRTSCOPE_DEBUG=1`` shows the traceback.
    """
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        print("srtscope: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        if os.environ.get("SRTSCOPE_DEBUG"):
            raise
        print(f"srtscope: internal error: {type(exc).__name__}: {exc} "
              f"(set SRTSCOPE_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(int(Exit.INTERNAL))


if __name__ == "__main__":
    main()
