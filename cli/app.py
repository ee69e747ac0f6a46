"""The ``srtscope`` typer app: run, capture, diagnose, compare, cache.

Exit codes: 0 success; 2 bad input (one line on stderr); 3 regression (compare); 1 internal error.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import typer
from typer.core import TyperGroup

from srtscope.cli.errors import Exit, one_line

#: Allocator settings of the srtscope process, read by numpy and pyarrow when first imported (so set
#: here, before either is: nothing imported above imports them); a value the user set wins.
#: NOTE: numpy asks the kernel for transparent huge pages on large arrays; on the machines measured (a
#: VM) that cost more than it saved: a 1 GB export's diagnosis spent 12 s in the kernel with it, 3.5 s
#: without (16.3 s -> 10.2 s wall), same output. Arrow's default jemalloc pool did the same to a cache
#: hit on that export: 7-7.5 s in the kernel, 1.7 s with the system allocator (7.8 s -> 4.5 s wall).
ALLOCATOR_ENV = {"NUMPY_MADVISE_HUGEPAGE": "0", "ARROW_DEFAULT_MEMORY_POOL": "system"}
for _k, _v in ALLOCATOR_ENV.items():
    os.environ.setdefault(_k, _v)

try:                                      # typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as click_exc
except ImportError:                       # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exc  # type: ignore[no-redef]


@contextmanager
def one_line_cache_warnings() -> Iterator[None]:
    """Inside the block, a ``CacheWarning`` prints as one line ``srtscope: warning: ...`` on
    stderr (not Python's two lines with a file name and source line); other warnings as usual."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if category.__name__ == "CacheWarning":
            from srtscope.cli.escape import terminal_line

            print(f"srtscope: warning: {terminal_line(str(message))}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _stdout_closed() -> bool:
    """Whether whoever reads our stdout has gone (a pipe whose reader closed it: ``| head``)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


class OneLineGroup(TyperGroup):
    """The app's group: a usage error (unknown option or command, missing argument, bad value) is
    one line ``srtscope: error: ...`` on stderr with exit 2, not click's multi-line box. A reader
    that stops early (``srtscope diagnose ... | head``) ends the command quietly with exit 0."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not _stdout_closed():
                raise                       # another pipe or socket: an error like any other
            # NOTE: what is still buffered for stdout goes nowhere, so the exit's flush cannot fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            with one_line_cache_warnings():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  windows_expand_args=windows_expand_args, **extra)
        except click_exc.NoArgsIsHelpError as exc:
            typer.echo(exc.ctx.get_help())
            rv = int(Exit.BAD_INPUT)
        except click_exc.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "srtscope"
            print(f"srtscope: error: {one_line(exc.format_message())} (see {where} --help)",
                  file=sys.stderr)
            rv = int(Exit.BAD_INPUT)
        except click_exc.ClickException as exc:
            print(f"srtscope: error: {one_line(exc.format_message())}", file=sys.stderr)
            rv = int(Exit.BAD_INPUT)
        except typer.Abort:
            print("srtscope: interrupted", file=sys.stderr)
            rv = 130
        except SystemExit as exc:
            # NOTE: click's own answer to a closed stdout outside a command (--help | head): exit 1
            # with stdout wrapped to swallow the last flush; ours is exit 0, as in ``invoke``
            if exc.code != 1 or type(sys.stdout).__name__ != "PacifyFlushWrapper":
                raise
            rv = 0
        code = rv if isinstance(rv, int) else 0
        if _terminated_by:
            code = 128 + _terminated_by[0]
        if not standalone_mode:
            return code
        sys.exit(code)


_terminated_by: list[int] = []     # the signal that ended a run being captured (SIGTERM)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM while ``capture --backend torch`` profiles this process: unwind like Ctrl-C (the
    trace is flushed), then exit 128+15."""
    _terminated_by.append(signum)
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


app = typer.Typer(
    name="srtscope",
    cls=OneLineGroup,
    help="Why is my GPU idle, and whose fault is it: the scheduler, batch preparation, or the kernels?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,    # plain click help: no markup eaten ([cluster]), words never split, no <bool>
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
    from srtscope.cli import cmd_cache, cmd_capture, cmd_compare, cmd_diagnose, cmd_run

    for mod in (cmd_run, cmd_capture, cmd_diagnose, cmd_compare, cmd_cache):
        mod.register(app)
    for info in app.registered_commands:     # the command list shows each one's summary whole
        doc = (info.callback.__doc__ or "").strip() if info.callback else ""
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.split("\n\n")[0].split())    # the first paragraph whole


_register()


def main() -> None:
    """Console entry point: user errors exit 2 (one line), internal errors exit 1.

    An internal error prints one line naming the exception; ``SRTSCOPE_DEBUG=1`` shows the traceback.
    """
    from srtscope.analyzers.pipeline.heap import keep_freed_pages
    from srtscope.probes.torch_capture import TORCH_PROFILE_ENV

    keep_freed_pages()
    if os.environ.get(TORCH_PROFILE_ENV):
        signal.signal(signal.SIGTERM, _terminate)
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        print("srtscope: interrupted", file=sys.stderr)
        sys.exit(128 + (_terminated_by[0] if _terminated_by else signal.SIGINT))
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
