"""``srtscope cache [--clear]``: what the cache folder holds (tables read from traces, kept
answers), how much of its cap that is, and a way to empty it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from srtscope.cli.errors import fail


def _what(entry: Path) -> tuple[str, str]:
    """(kind, the trace(s) it is about) of one entry; ("damaged", "") when its meta does not read."""
    try:
        key = json.loads((entry / "meta.json").read_text()).get("key") or {}
    except (OSError, ValueError, AttributeError):
        return "damaged", ""
    if entry.name.startswith("diagnosis-"):
        files = key.get("files") or []
        return "answer", ", ".join(str(f.get("given", "?")) for f in files)
    return "tables", f"{key.get('path', '?')} (rank {key.get('rank', '?')})"


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def register(app: typer.Typer) -> None:
    @app.command("cache")
    def cache_cmd(
        clear: bool = typer.Option(False, "--clear", help="Remove every entry (the traces are not touched)."),
    ) -> None:
        """Show the cache (tables read from traces and kept answers), or empty it with --clear."""
        from srtscope.analyzers.cache_store import CacheStore

        cache = CacheStore()
        console = Console()
        if not cache.root.exists():
            console.print(f"cache {cache.root}: empty (cap {_size(cache.cap)})")
            return
        try:
            found = cache.entries()
        except OSError as exc:
            fail(f"{cache.root}: cannot read the cache folder: {exc.strerror or exc}")
        if clear:
            for _, _, entry in found:
                cache.drop(entry)
            left = cache.entries()
            if left:
                fail(f"{cache.root}: {_entries(len(left))} could not be removed")
            console.print(f"cache {cache.root}: {_entries(len(found))} removed "
                          f"({_size(sum(b for _, b, _ in found))})")
            return
        total = sum(b for _, b, _ in found)
        console.print(f"cache {cache.root}: {_entries(len(found))}, {_size(total)} of {_size(cache.cap)} "
                      "(least recently used go first; SRTSCOPE_CACHE_MAX_MB sets the cap)")
        if not found:
            return
        table = Table(show_edge=False)
        for col in ("last used", "kind", "size", "trace(s)"):
            table.add_column(col, justify="right" if col == "size" else "left")
        for used, size, entry in reversed(found):          # most recent first
            kind, traces = _what(entry)
            table.add_row(time.strftime("%Y-%m-%d %H:%M", time.localtime(used)), kind, _size(size), traces)
        console.print(table)
