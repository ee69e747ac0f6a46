"""The ``srtscope`` typer app. Subcommands register themselves from their own modules."""
from __future__ import annotations

from importlib import metadata

import typer

app = typer.Typer(
    name="srtscope",
    help="Why is my GPU idle, and whose fault is it: the scheduler, batch preparation, or the kernels?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
