"""Second look at the same question: a diagnosis's JSON document kept in the user's cache.

    doc = get_diagnosis(key) or put_diagnosis(key, diagnose(...).to_json())

The table cache (``readers/cache.py``) spares a second look the read; this spares it the analyses
too when nothing that decides the answer changed, and it imports neither numpy nor pandas
(``cache_store.py``), so an answer from it costs little more than Python's start.

Key (``diagnosis_key``): every input file's table-cache key (path, size, mtime, inode, device,
fingerprint of its first and last 64 KiB), in order and as the user spelled it (the document names
its sources), the diagnosis parameters, a fingerprint of the code that computes the document (SHA-1
of every analyzer and probe source file) and the numpy and pandas versions: any change of a trace,
a parameter or the code is a miss. Entries live in the table cache's directory, under the same size
cap and least-recently-used eviction, written atomically; an entry that does not parse or whose key
differs is dropped, never trusted.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from srtscope.analyzers.cache_store import META, CacheStore, trace_key

#: Layout of a diagnosis entry; bump when this module's format changes.
ENTRY_FORMAT = 1
_PREFIX = "diagnosis-"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-1 over the sources of ``srtscope.analyzers`` and ``srtscope.probes`` (names and bytes)."""
    import srtscope.analyzers
    import srtscope.probes

    h = hashlib.sha1(usedforsecurity=False)
    for pkg in (srtscope.analyzers, srtscope.probes):
        for folder in pkg.__path__:
            root = Path(folder)
            for f in sorted(root.rglob("*.py")):
                h.update(str(f.relative_to(root)).encode() + b"\0")
                h.update(f.read_bytes())
    return h.hexdigest()


def diagnosis_key(paths: Sequence[Path], params: Mapping[str, Any]) -> dict | None:
    """The key of diagnosing ``paths`` (in this order) with ``params``; None when a file cannot be
    keyed (the read then says what is wrong with it)."""
    try:
        files = [{"given": str(p), **asdict(trace_key(p, i))} for i, p in enumerate(paths)]
    except OSError:
        return None
    return {"files": files, "params": json.loads(json.dumps(dict(params), sort_keys=True)),
            "code": code_fingerprint(), "numpy": _version("numpy"), "pandas": _version("pandas"),
            "entry_format": ENTRY_FORMAT}


def _version(dist: str) -> str:
    """An installed distribution's version, read from its metadata (no import of the package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _entry(key: dict) -> Path:
    name = hashlib.sha1(json.dumps(key, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[:32]
    return CacheStore().root / f"{_PREFIX}{name}"


def get_diagnosis(key: dict | None) -> dict | None:
    """The cached document of ``key``; None (and a bad entry dropped) when missing, stale or damaged."""
    if key is None:
        return None
    entry = _entry(key)
    try:
        stored = json.loads((entry / META).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        CacheStore().drop(entry)
        return None
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("doc"), dict):
        CacheStore().drop(entry)
        return None
    try:
        os.utime(entry / META)
    except OSError:
        pass
    return stored["doc"]


def put_diagnosis(key: dict | None, doc: dict) -> dict:
    """Keep ``doc`` under ``key`` (atomically; then evict down to the cap) and return it. Never
    raises for the cache's own trouble: one warning per process."""
    if key is None:
        return doc
    def write(folder: Path) -> None:
        (folder / META).write_text(json.dumps({"key": key, "doc": doc}))

    CacheStore().publish(_entry(key).name, write)
    return doc
