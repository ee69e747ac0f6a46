"""Names from traces in every output kind (``cli/escape.py``, issue 26 items 5 and 6): Markdown never
turns a name into HTML, a link or a remote image; the terminal never receives an escape sequence
and rich never reads markup such as ``[/]`` in a name (that raised ``MarkupError``)."""
from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from srtscope.cli import escape
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

HOSTILE = {
    "html": "<img src=x onerror=alert(1)>",
    "image": "![t](https://evil.example/x.png)",
    "link": "[click](javascript:alert(1))",
    "autolink": "<https://evil.example>",
    "emphasis": "*bold* _it_ ~~gone~~",
    "code": "`tick` and ``two``",
    "heading": "# not a heading",
    "table": "a | b | c",
    "entity": "&lt;script&gt;",
    "escape_seq": "\x1b]0;pwned\x07\x1b[2Jname",
    "bidi": "abc\u202edcba",
    "rich_markup": "[/] [bold red]x[/bold red]",
}


def _md_is_literal(s: str) -> None:
    """Nothing in ``s`` is Markdown or HTML syntax: no raw ``<``, every syntax character escaped."""
    assert "<" not in s and ">" not in s
    assert not re.search(r"(?<!\\)[\[\]*_`|~]", s), s
    assert not re.search(r"&(?!amp;|lt;|gt;)", s), s


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_markdown_text_is_literal(name):
    _md_is_literal(escape.markdown(name))


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_markdown_code_span_cannot_be_closed(name):
    out = escape.markdown_code(name)
    assert out.startswith("`") and out.endswith("`") and out.count("`") == 2
    assert "\x1b" not in out and "|" not in out.replace("\\|", "")


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_terminal_prints_the_characters_only(name):
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system=None, width=400).print(escape.terminal(name))
    out = buf.getvalue()
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert escape.terminal_line(name) in out
    if name.startswith("[/]"):
        assert "[/] [bold red]x[/bold red]" in out          # shown as written, never read as markup


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_html_is_text(name):
    out = escape.html(name)
    assert "<" not in out and ">" not in out and '"' not in out and "\x1b" not in out


def test_a_markdown_report_with_hostile_names(tmp_path):
    """The audit: ``<img onerror>`` and ``![t](https://…)`` in a kernel name reached --markdown raw."""
    from srtscope.cli.markdown import diagnosis_markdown

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(SAMPLES / "kernel_bound.sqlite", trace)
    r = CliRunner().invoke(app, ["diagnose", "--json", "--no-cache", str(trace)])
    doc = json.loads(r.stdout)
    doc["top_kernels"][0]["name"] = HOSTILE["html"] + HOSTILE["image"]
    doc["verdict"]["summary"] = HOSTILE["link"]
    doc["bubbles"]["by_stage"] = {HOSTILE["image"]: 1000}
    md = diagnosis_markdown(doc)
    # a code span shows its content as written (CommonMark): no HTML, link or image inside one
    spans = re.findall(r"`[^`]*`", md)
    assert "`<img src=x onerror=alert(1)>![t](https://evil.example/x.png)`" in spans
    outside = re.sub(r"`[^`]*`", "", md)
    assert "<img" not in outside and "![" not in outside and not re.search(r"(?<!\\)\]\(", outside)
    assert "\\[click\\](javascript:alert(1))" in outside


def test_cache_listing_with_escape_sequences_and_markup_in_a_file_name(tmp_path, monkeypatch):
    """The audit: escape sequences in a trace's file name were printed raw by ``srtscope cache`` (they
    retitled the window, cleared the screen); ``[/]`` in a path exited 1 with MarkupError, after
    ``--clear`` had already removed the entries."""
    monkeypatch.setenv("SRTSCOPE_CACHE_MIN_BYTES", "0")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("COLUMNS", "300")
    folder = tmp_path / "a[/]b [bold]c"
    folder.mkdir(parents=True)           # "a[" holding "]b [bold]c": the path reads a[/]b ...
    trace = folder / "t\x1b]0;pwned\x07\x1b[2J.sqlite"
    shutil.copyfile(SAMPLES / "healthy.sqlite", trace)
    r = CliRunner().invoke(app, ["diagnose", "--json", str(trace)])
    assert r.exit_code == 0, r.output
    for args in (["cache"], ["cache", "--clear"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout
        if args == ["cache"]:
            assert "a[/]b [bold]c/t]0;pwned[2J.sqlite" in r.stdout
        else:
            assert "2 entries removed" in r.stdout
