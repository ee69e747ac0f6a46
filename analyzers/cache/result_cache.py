"""Second look at the same question: a diagnosis's JSON document kept in the user's cache.

    doc = get_diagnosis(key) or put_diagnosis(key, diagnose(...).to_json())

The table cache (``cache/table_cache.py``) spares a second look the read; this spares it the analyses
too when nothing that decides the answer changed, and it imports neither numpy nor pandas
(``cache/cache_store.py``), so an answer from it costs little more than Python's start.

Key (``diagnosis_key``): every input file's table-cache key (path, size, mtime, ctime, inode,
device, a hash of all of its bytes), in order and as the user spelled it (the document names its
sources), the diagnosis parameters, a fingerprint of the code that computes the document (SHA-1
of every analyzer and probe source file) and the numpy and pandas versions: any change of a trace,
a parameter or the code is a miss. Entries live in the table cache's directory, under the same size
cap and least-recently-used eviction, written atomically and authenticated with this user's key
(``cache/cache_store.py``); an entry that does not verify, does not parse, whose key differs, or whose
document the caller's ``check`` refuses (the JSON contract: types, required keys, no NaN) is
dropped and recomputed, never trusted.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from srtscope.analyzers.cache.cache_store import META, CacheStore, trace_key

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


def _name(key: dict) -> str:
    return _PREFIX + hashlib.sha1(json.dumps(key, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[:32]


KIND = "answer"


def get_diagnosis(key: dict | None, check: Callable[[dict], object] | None = None) -> dict | None:
    """The cached document of ``key``; None (and a bad entry dropped) when missing, stale, damaged,
    not verified with this user's key, or refused by ``check`` (which raises ValueError)."""
    if key is None:
        return None
    store = CacheStore()
    name = _name(key)
    meta = store.open_entry(name, KIND)
    if meta is None:
        return None
    try:
        stored = json.loads(meta)
        if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("doc"), dict):
            raise ValueError("another key, or no document")
        if check is not None:
            check(stored["doc"])
    except (ValueError, RecursionError):
        store.drop(store.root / name)
        return None
    try:
        os.utime(store.root / name / META, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    return stored["doc"]


def put_diagnosis(key: dict | None, doc: dict) -> dict:
    """Keep ``doc`` under ``key`` (atomically; then evict down to the cap) and return it. Never
    raises for the cache's own trouble: one warning per process. A document JSON cannot hold
    exactly (NaN, infinity) is not kept."""
    if key is None:
        return doc
    try:
        text = json.dumps({"key": key, "doc": doc}, allow_nan=False)
    except ValueError:
        return doc

    def write(folder: Path) -> None:
        (folder / META).write_text(text)

    CacheStore().publish(_name(key), KIND, write)
    return doc
