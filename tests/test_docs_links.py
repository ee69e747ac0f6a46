"""Every relative link in README.md, benchmarks/README.md and docs/*.md points to a file that exists,
and a link to a heading (``file.md#anchor`` or ``#anchor``) to a heading that file has, by GitHub's
rules for heading anchors."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path``: lower case, punctuation but ``-`` and ``_``
    dropped, spaces to ``-``; a repeated one gets ``-1``, ``-2``, ..."""
    out: set[str] = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        base, n = slug, 0
        while slug in out:
            n += 1
            slug = f"{base}-{n}"
        out.add(slug)
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_pages_have_links():
    assert len(links(REPO / "README.md")) >= 10
    assert (REPO / "docs" / "json_contract.md").exists() and (REPO / "docs" / "structure.md").exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)
