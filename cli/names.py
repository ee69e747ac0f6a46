"""Short kernel names for narrow tables: distinct, the function name kept, template arguments elided
first. The full names stay in the JSON and the HTML report.

The rule, per name, at the lowest level that tells it apart from the others in the same table:
level 0 drops a leading ``void`` and the parameter list and writes every template argument list as
``<…>``; level k keeps template arguments down to nesting depth k; the last level is the whole name.
Each is then clipped to the column (from the end first, so the function name stays); names still
alike after that are clipped keeping more of their end, and as a last resort numbered ``#2, #3…``.
"""
from __future__ import annotations

import os
import re

from srtscope.analyzers.model.units import clean_text, clip_text

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")

#: words that rarely tell two kernels apart by themselves: left out of a tag when others differ
_NOISE = frozenset({"anonymous", "namespace", "unnamed", "lambda", "const", "unsigned", "signed", "long",
                    "short", "void", "bool", "std", "at", "native", "detail", "cuda"})
_OPEN, _CLOSE = "<({[", ">)}]"
MAX_DEPTH = 4


def _balanced(name: str) -> bool:
    stack: list[str] = []
    for ch in name:
        if ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                return False
    return not stack


def _top_params_start(name: str) -> int:
    """Index of the top-level parameter list's ``(`` at the end of a demangled name; -1 if none."""
    if not name.endswith(")"):
        return -1
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch in _CLOSE:
            depth += 1
        elif ch in _OPEN:
            depth -= 1
            if depth == 0:
                return i if ch == "(" and i > 0 else -1
    return -1


def elide(name: str, level: int) -> str:
    """``name`` with template arguments deeper than ``level`` written ``…`` and, below
    ``MAX_DEPTH + 1``, its top-level parameter list dropped. Unbalanced names and operators (whose
    ``<`` is no bracket) are returned whole."""
    name = clean_text(name, 4096)
    if level > MAX_DEPTH or "operator" in name or not _balanced(name.replace("->", "")):
        return name
    base = name[5:] if name.startswith("void ") else name
    for anon in ("<unnamed>::", "(anonymous namespace)::"):
        base = base.replace(anon, "")
    p = _top_params_start(base)
    if p > 0:
        base = base[:p]
    out: list[str] = []
    depth = 0
    for ch in base:
        if ch == "<":
            depth += 1
            if depth == level + 1:
                out.append("<…")
                continue
        elif ch == ">":
            depth -= 1
            if depth == level:
                out.append(">")
                continue
        if depth <= level:
            out.append(ch)
    return "".join(out)


def short_names(names: list[str], width: int) -> list[str]:
    """Each name in at most ``width`` characters, two different names never alike (see module doc)."""
    width = max(width, 8)
    full = [clean_text(n, 4096) for n in names]
    level = [0] * len(full)

    def shown(i: int) -> str:
        return clip_text(elide(full[i], level[i]), width)

    while True:
        out = [shown(i) for i in range(len(full))]
        clash = _clashing(out, full)
        bumpable = [i for i in clash if level[i] <= MAX_DEPTH]
        if not bumpable:
            break
        for i in bumpable:
            level[i] += 1
    before = list(out)
    tags = [""] * len(full)
    for i in _clashing(before, full):   # alike in the column: tag with the words that tell them apart
        others = [f for s_, f in zip(before, full) if s_ == before[i] and f != full[i]]
        theirs = [w for f in others for w in _words(f)]
        diff = [w for w in _words(full[i]) if any(w not in _words(f) for f in others)]
        diff = [w for w in diff if w not in _NOISE] or diff
        if diff:
            tags[i] = " [" + clip_text(" ".join(_telling(w, theirs) for w in diff), max(width // 2, 6)) + "]"
            out[i] = clip_text(elide(full[i], 0), width - len(tags[i])) + tags[i]
    seen: dict[str, int] = {}
    for i in _clashing(out, full):      # last resort: number them (a tag is kept whole, the name cut)
        seen[out[i]] = seen.get(out[i], 0) + 1
        num = f" #{seen[out[i]]}"
        head = out[i][:len(out[i]) - len(tags[i])]
        out[i] = clip_text(head, width - len(tags[i]) - len(num)) + tags[i] + num
    return out


def _telling(word: str, theirs: list[str]) -> str:
    """``word`` from the separator (``_``, ``:``) before where it parts from the most alike of
    ``theirs``, led by ``…``: ``…nn_align4`` of ``cutlass_80_…_16x4_nn_align4`` beside ``…_nt_align4``
    (its start, alike in all of them, tells nothing)."""
    alike = max((len(os.path.commonprefix([word, w])) for w in theirs), default=0)
    cut = max(word.rfind("_", 0, alike), word.rfind(":", 0, alike)) + 1
    return "…" + word[cut:] if cut > 0 else word


def _words(name: str) -> list[str]:
    """Identifiers and numbers of ``name``, each once, in order."""
    return list(dict.fromkeys(_WORD.findall(name)))


def _clashing(out: list[str], full: list[str]) -> list[int]:
    """Indices whose shown form equals the shown form of a different full name."""
    by: dict[str, set[str]] = {}
    for s, f in zip(out, full):
        by.setdefault(s, set()).add(f)
    return [i for i, s in enumerate(out) if len(by[s]) > 1]
