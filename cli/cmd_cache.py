"""``srtscope cache [--clear]``: what the cache folder holds (tables read from traces, kept
answers, leftovers of killed writers), how much of its cap that is, and a way to empty it. Only
srtscope's own folders (``cache/cache_store.py``: by the marker inside, never by name) are counted or
removed; everything else is named as left alone."""
from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.table import Table

from srtscope.analyzers.model.units import plural
from srtscope.cli import escape
from srtscope.cli.errors import fail
from srtscope.cli.terminal import Console


def _what(entry: Path, kind: str) -> tuple[str, str]:
    """(kind, the trace(s) it is about) of one entry; ("damaged", "") when its meta does not read."""
    from srtscope.analyzers.cache.cache_auth import read_regular
    from srtscope.analyzers.cache.cache_store import MAX_META_BYTES, META

    try:
        doc = json.loads(read_regular(entry / META, MAX_META_BYTES))
        key = doc.get("key") or {}
        if kind == "answer":
            return "answer", ", ".join(str(f.get("given", "?")) for f in key.get("files") or [])
        return "tables", f"{key.get('path', '?')} (rank {key.get('rank', '?')})"
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return "damaged", ""


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _names(paths: list[Path], most: int = 3) -> str:
    shown = ", ".join(escape.terminal_line(p.name, 80) for p in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _left_alone(console: Console, scan: object) -> None:
    """One line each for what srtscope did not make, and for temp folders being written now."""
    foreign, busy = scan.foreign, scan.busy  # type: ignore[attr-defined]
    if foreign:
        console.print(escape.terminal(f"left alone: {plural(len(foreign), 'item')} srtscope did not make "
                                      f"({_names(foreign)})"))
    if busy:
        console.print(escape.terminal(f"left alone: {len(busy)} entr{'y' if len(busy) == 1 else 'ies'} "
                                      "being written now by a running srtscope"))


def register(app: typer.Typer) -> None:
    @app.command("cache")
    def cache_cmd(
        clear: bool = typer.Option(False, "--clear", help="Remove every entry and leftover srtscope made "
                                                          "(traces and other files are not touched)."),
    ) -> None:
        """Show the cache (tables read from traces and kept answers), or empty it with --clear."""
        from srtscope.analyzers.cache.cache_store import CacheSettingError, CacheStore

        try:
            cache = CacheStore()
        except CacheSettingError as exc:
            fail(str(exc))
        console = Console(highlight=False)
        where = escape.terminal_line(cache.root, 400)
        if not cache.root.exists():
            console.print(escape.terminal(f"cache {where}: empty (cap {_size(cache.cap)})"))
            return
        try:
            scan = cache.scan()
        except OSError as exc:
            fail(f"{where}: cannot read the cache folder: {exc.strerror or exc}")
        if clear:
            removed = [x for x in scan.entries if cache.drop(x.path)]
            reclaimed = cache.reclaim(scan)
            freed = sum(x.size for x in removed + reclaimed)
            extra = f" and {plural(len(reclaimed), 'leftover')} of killed runs" if reclaimed else ""
            console.print(escape.terminal(f"cache {where}: {_entries(len(removed))}{extra} removed "
                                          f"({_size(freed)})"))
            _left_alone(console, scan)
            failed = len(scan.entries) - len(removed) + len(scan.leftovers) - len(reclaimed)
            if failed:
                fail(f"{where}: {_entries(failed)} could not be removed (permissions?)")
            return
        total = sum(x.size for x in scan.entries)
        console.print(escape.terminal(f"cache {where}: {_entries(len(scan.entries))}, {_size(total)} of "
                                      f"{_size(cache.cap)} (least recently used go first; "
                                      "SRTSCOPE_CACHE_MAX_MB sets the cap)"))
        rows = []
        for x in reversed(scan.entries):                  # most recent first
            kind, traces = _what(x.path, x.kind)
            if kind != "damaged" and cache.verified(x.path) is False:
                kind = "unverified"                       # another user's, or edited: never used
            rows.append((x.used, kind, traces, x.size))
        rows += [(x.used, "leftover", f"{x.path.name} (a killed run's; the next write or --clear "
                                      "removes it)", x.size) for x in scan.leftovers]
        if rows:
            table = Table(show_edge=False)
            for col in ("last used", "kind", "size", "trace(s)"):
                # NOTE: a long path folds onto more lines rather than losing its file name to "…"
                table.add_column(col, justify="right" if col == "size" else "left",
                                 overflow="fold" if col == "trace(s)" else "ellipsis")
            for used, kind, traces, size in rows:
                table.add_row(time.strftime("%Y-%m-%d %H:%M", time.localtime(used)), kind, _size(size),
                              escape.terminal(traces, 400))
            console.print(table)
        _left_alone(console, scan)
