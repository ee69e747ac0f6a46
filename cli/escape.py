"""Text from traces (kernel names, file names, messages) made safe for each kind of output, one
helper per kind: every renderer goes through these.

- ``terminal``: control characters (escape sequences: they retitle windows, clear screens) and
  bidirectional overrides removed, as a rich ``Text`` (rich never reads markup such as ``[/]`` in it);
  ``terminal_line`` the same as a plain string for ``print``.
- ``markdown``: the above, with HTML (``<img onerror=…>``) and Markdown syntax (links and images
  ``[t](u)`` / ``![t](u)``, emphasis, code, headings, table pipes) backslash-escaped or entity-coded,
  so a name shows as its characters and never becomes markup, a link or a remote image.
- ``markdown_code``: a name inside a code span (nothing is markup there but the backtick and, in a
  table, the pipe).
- ``html``: the above, entity-coded for HTML text and attribute values.
"""
from __future__ import annotations

import html as _html
import re

from rich.text import Text

from srtscope.analyzers.model.units import clean_text

#: bidirectional embeddings, overrides and isolates: they reorder what a terminal or browser shows
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
#: the characters that make Markdown syntax anywhere in a line (CommonMark, GFM), escaped with a
#: backslash: without ``[`` and ``]`` no link or image can form (``!`` and ``(`` are then plain), and
#: ``<``, ``>``, ``&`` become entities (no HTML, no autolink). Line-start syntax (``#``, ``-``,
#: ``1.``) cannot arise: names are never put at the start of a line.
_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")


def plain(text: object, limit: int = 4096) -> str:
    """``text`` as printable characters: no control characters, no bidi overrides, at most ``limit``."""
    return _BIDI.sub("", clean_text(text, limit))


def terminal(text: object, limit: int = 4096, style: str = "") -> Text:
    """A rich ``Text`` of ``text`` (see ``plain``): printed as its characters, never as markup."""
    return Text(plain(text, limit), style=style)


def terminal_line(text: object, limit: int = 4096) -> str:
    """``plain`` on one line, for ``print`` (no rich involved)."""
    return " ".join(plain(text, limit).split())


def markdown(text: object, limit: int = 4096) -> str:
    """``text`` as Markdown text that renders as exactly its characters (no HTML, links, images,
    emphasis or table breaks)."""
    s = plain(text, limit)
    s = _MD_PUNCT.sub(r"\\\1", s)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_code(text: object, limit: int = 4096) -> str:
    """``text`` as a Markdown code span (backticks replaced, pipes escaped for tables)."""
    return "`" + plain(text, limit).replace("`", "'").replace("|", "\\|") + "`"


def html(text: object, limit: int = 4096) -> str:
    """``text`` as HTML text or a quoted attribute value."""
    return _html.escape(plain(text, limit), quote=True)
