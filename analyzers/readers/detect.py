"""Format detection from a file's first bytes — never from its name.

SQLite magic -> nsys export; gzip magic -> look inside; JSON object -> probe trace when it declares
``"format": "srtscope-probe"``, else Kineto (Chrome trace JSON).
"""
from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from srtscope.analyzers.model.timeline import SourceFormat
from srtscope.analyzers.readers.errors import TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_BYTES = 1 << 16
_PROBE_RE = re.compile(rb'"format"\s*:\s*"srtscope-probe"')


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
    if head[:2] == GZIP_MAGIC:
        got = b""
        try:
            with gzip.open(path, "rb") as gz:
                while len(got) < _SNIFF_BYTES and (part := gz.read1(_SNIFF_BYTES - len(got))):
                    got += part
        except (OSError, EOFError, zlib.error) as exc:
            # NOTE: a file cut after some whole members (a probe stream whose writer was killed) has
            # a head: its reader decides what the cut costs
            if not got:
                raise TraceError(path, f"corrupt gzip data ({exc})") from None
        return got
    return head


def detect_format(path: str | Path) -> SourceFormat:
    """The format of ``path`` from its content; ``TraceError`` when it is none we read."""
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "no such file")
    if not path.is_file():
        raise TraceError(path, "not a regular file")
    with open(path, "rb") as fh:
        magic = fh.read(len(SQLITE_MAGIC))
    if not magic:
        raise TraceError(path, "empty file")
    if magic == SQLITE_MAGIC:
        return SourceFormat.NSYS_SQLITE
    head = _head(path)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise TraceError(path, "empty file (only whitespace)")
    if text[:1] == b"{":
        if _PROBE_RE.search(text):
            return SourceFormat.PROBE
        return SourceFormat.KINETO
    if text[:1] == b"[":
        raise TraceError(path, "JSON array (bare Chrome event list) is not a Kineto trace: "
                               "expected an object with traceEvents")
    if head[:4] == b"PK\x03\x04":
        raise TraceError(path, "a zip archive, not a trace")
    raise TraceError(path, "unrecognised format: not an SQLite database, not JSON, not gzip JSON "
                           "(an .nsys-rep report must be exported first: nsys export --type sqlite)")
