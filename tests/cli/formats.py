"""Well-formedness checks for the files ``diagnose`` / ``compare`` write: Markdown through a GFM
parser (markdown-it-py, tables on), HTML through a tag-balance parse (and headless Chromium where
installed), Perfetto through ``json`` and per-event checks. Shared by the output tests."""
from __future__ import annotations

import html as htmllib
import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_PIPE = re.compile(r"(?<!\\)\|")


def gfm() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table").enable("strikethrough")


def text_of(html_text: str) -> str:
    """Visible text of an HTML fragment, whitespace runs as one space."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html_text)).split())


def check_markdown(text: str) -> str:
    """Parse ``text`` as GFM; every table row has the header's cell count (an unescaped ``|`` from
    a trace would add one). Returns the rendered HTML's visible text."""
    md = gfm()
    tokens = md.parse(text)
    lines = text.splitlines()
    tables = [t for t in tokens if t.type == "table_open"]
    for t in tables:
        assert t.map is not None
        rows = [ln for ln in lines[t.map[0]:t.map[1]] if ln.strip()]
        cells = [len(_PIPE.split(ln.strip().strip("|"))) for ln in rows]
        assert len(set(cells)) == 1, (cells, rows)
    # every line that looks like a table row sits inside a parsed table
    in_table = {i for t in tables for i in range(*t.map)}  # type: ignore[misc]
    stray = [ln for i, ln in enumerate(lines) if ln.startswith("|") and i not in in_table]
    assert not stray, stray
    return text_of(md.render(text))


class _Balance(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "script":
            self.scripts += 1
            if any(k == "src" for k, _ in attrs):
                self.errors.append("external script")
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else '-'}>")
            return
        self.stack.pop()


def check_html(page: str) -> _Balance:
    """A whole, balanced, offline page (no external src/href)."""
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    p = _Balance()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, p.stack
    return p


def browse(page: Path, tmp: Path, size: str = "1200,1600", shot: Path | None = None,
           fragment: str = "") -> tuple[str, str]:
    """(DOM after scripts ran, Chromium's log) of ``page`` (plus ``fragment``) in headless Chromium."""
    assert CHROMIUM
    args = [CHROMIUM, *CHROMIUM_FLAGS, f"--window-size={size}", f"--user-data-dir={tmp / 'profile'}"]
    if shot is not None:
        args.append(f"--screenshot={shot}")
    r = subprocess.run([*args, "--dump-dom", page.as_uri() + fragment], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, r.stderr


def console_messages(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if "CONSOLE" in ln]


def check_perfetto(doc: Any, diagnosis: dict | None = None) -> list[dict]:
    """A Chrome-trace document: events with ph/pid/tid, finite ts and dur >= 0 on slices; with the
    diagnosis, one bubble slice per bubble and one step slice per step. Returns the events."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert isinstance(doc["otherData"]["clock_offset_ns"], int)
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "i", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert math.isfinite(e["ts"]) and math.isfinite(e["dur"]) and e["dur"] >= 0, e
            assert isinstance(e["name"], str) and e["name"], e
    ev = doc["traceEvents"]
    if diagnosis is not None:
        assert sum(e.get("cat") == "bubble" for e in ev) == diagnosis["bubbles"]["count"]
        assert sum(e.get("cat") == "step" for e in ev) == diagnosis["steps"]["count"]
    json.dumps(doc, allow_nan=False)
    return ev
