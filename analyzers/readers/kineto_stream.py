"""A Kineto trace's ``traceEvents`` decoded in batches by msgspec, straight from the (gzip) bytes.

    for batch in event_batches(path, header.__setitem__):   # lists of ``Event``
        ...

The text is inflated by ISA-L (``isal.igzip``) a block at a time (``BLOCK`` bytes); each block's
events up to the last boundary between two events (``}``, a comma, ``{``) are decoded in one call
into ``Event`` structs that keep only the fields the reader uses (untracked by the cyclic garbage
collector: they hold no cycles, and tracking them made decoding ~2x slower) (``ts`` / ``dur`` as their raw
literal text: ``kineto_times`` converts them exactly). The top-level members before and after the
array go to ``on_header`` as the stdlib parser gives them (``jsonstream._parse_float``).

Optimistic: anything this does not take as it expects — an element that is no object, a field of
an unexpected type, a cut that does not decode, no boundary within the
streaming parser's caps (``_cap``), a gzip or
UTF-8 error, no ``traceEvents`` array near the start — raises ``Fallback``, and the exact streaming
reader (``jsonstream``) reads the file from the start: its answer or its one-line error stands.
Memory: a block, the bytes left after its last boundary and one batch's structs.
"""
from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from srtscope.analyzers.readers import jsonstream
from srtscope.analyzers.readers.jsonstream import STREAMED, _parse_float

#: bytes inflated at a time
BLOCK = 8 << 20
#: ``{`` in a batch at most (an event has one or two): tiny elements make many structs of a block
MAX_OPENS = 1 << 18
#: boundaries tried per block, from its end, before giving up on it
CUT_TRIES = 8
_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_WS = b" \t\r\n"


class Fallback(Exception):
    """The batched decoder does not take this file as it is: the exact reader reads it instead."""


class Args(msgspec.Struct, gc=False):
    """The members of an event's ``args`` the reader uses (any JSON type; absent: ``UNSET``)."""

    correlation: Any = UNSET
    device: Any = UNSET
    stream: Any = UNSET
    bytes: Any = UNSET
    name: Any = UNSET


class Event(msgspec.Struct, gc=False):
    """One element of ``traceEvents``: the members the reader uses; ``ts`` / ``dur`` raw literals."""

    ph: Any = UNSET
    cat: Any = UNSET
    name: Any = UNSET
    pid: Any = UNSET
    tid: Any = UNSET
    ts: Raw | UnsetType = UNSET
    dur: Raw | UnsetType = UNSET
    id: Any = UNSET
    args: Args | None | UnsetType = UNSET


_DECODE = msgspec.json.Decoder(list[Event]).decode


def open_bytes(path: Path) -> IO[bytes]:
    """``path``'s JSON text as bytes: inflated by ISA-L when it is gzip."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if gz:
        from isal import igzip
        return igzip.open(path, "rb")
    return open(path, "rb")


def _decode(text: bytes) -> list[Event]:
    try:
        return _DECODE(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Fallback(str(exc)) from None


def _members(text: bytes, on_header: Callable[[str, Any], None]) -> None:
    """``text``: members of the top-level object (``"k": v, ...``), each to ``on_header`` (a key
    given twice: its first place, its last value, as the streaming parser's ``header`` dict)."""
    body = text.strip(_WS).strip(b",").strip(_WS)
    if not body:
        return
    try:
        obj = json.loads(b"{" + body + b"}", parse_float=_parse_float)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Fallback(f"top-level members: {exc}") from None
    for k, v in obj.items():
        on_header(k, v)


def event_batches(path: Path, on_header: Callable[[str, Any], None], block: int | None = None) -> Iterator[list[Event]]:
    """The events of ``path``'s ``traceEvents`` in batches (a block's worth each, ``BLOCK`` bytes by
    default); the other top-level members to ``on_header(key, value)`` (``traceEvents`` ->
    ``STREAMED``). ``Fallback`` for what the module doc lists."""
    try:
        with open_bytes(path) as fh:
            yield from _batches(fh, on_header, BLOCK if block is None else block)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise Fallback(f"{type(exc).__name__}: {exc}") from None


def _cap() -> int:
    """The most bytes held undecoded: the streaming parser's caps on one value and on a whitespace
    run (read at each call: the tests lower them). Text decoded in pieces no longer than this holds
    no value or run the streaming parser would refuse for its length."""
    return min(jsonstream.MAX_VALUE_CHARS, jsonstream.MAX_WS_RUN)


def _batches(fh: IO[bytes], on_header: Callable[[str, Any], None], block: int) -> Iterator[list[Event]]:
    cap = _cap()
    block = max(1, min(block, cap // 2))
    buf = b""
    eof = False
    while True:                                 # the members before the array
        m = _START.search(buf)
        if m is not None:
            break
        if eof or len(buf) > cap:
            raise Fallback("no traceEvents array near the start")
        data = fh.read(block)
        eof = not data
        buf += data
    if m.start() > cap:
        raise Fallback("top-level members before traceEvents longer than a value may be")
    head = buf[:m.start()].lstrip(b"\xef\xbb\xbf" + _WS)
    if not head.startswith(b"{"):
        raise Fallback("no object at the top")
    _members(head[1:], on_header)
    on_header("traceEvents", STREAMED)
    buf = buf[m.end():]
    first = True
    while True:
        if len(buf) > cap:
            raise Fallback(f"no boundary between events within {cap >> 20} MiB")
        if not eof and len(buf) < block:
            data = fh.read(block)
            eof = not data
            buf += data
            continue
        if eof:
            yield from _last(buf, first, on_header)
            return
        cut = _cut(buf)
        if cut is None:
            data = fh.read(block)
            eof = not data
            buf += data
            continue
        events, at = cut
        first = False
        rest = buf[at:].lstrip(_WS)
        if not rest.startswith(b","):
            raise Fallback("no comma after a cut")
        buf = rest[1:]
        yield events


def _cut(buf: bytes) -> tuple[list[Event], int] | None:
    """(events before the last boundary of ``buf`` that decodes, where they end), or None after
    ``CUT_TRIES`` boundaries that do not (one inside an event's nested value)."""
    hi = len(buf)
    sample = min(hi, 1 << 16)           # counted in full only where a sample says the block is dense
    if buf.count(b"{", 0, sample) * (hi / sample) > MAX_OPENS / 2 and (opens := buf.count(b"{")) > MAX_OPENS:
        hi = max(1, int(hi * MAX_OPENS / opens))    # tiny elements: fewer a batch (each a struct in memory)
    tail, tries = max(0, hi - (1 << 16)), 0
    while tries < CUT_TRIES:
        ends = [m.start() + 1 for m in _BOUNDARY.finditer(buf, tail, hi)]
        for end in reversed(ends):
            tries += 1
            try:
                return _decode(b"[" + buf[:end] + b"]"), end
            except Fallback:
                if tries >= CUT_TRIES:
                    return None
        if tail == 0:
            return None
        hi = min(ends) if ends else tail + 8      # a boundary is 3+ bytes: none lost at the seam
        tail = max(0, tail - (1 << 20))
    return None


def _last(buf: bytes, first: bool, on_header: Callable[[str, Any], None]) -> Iterator[list[Event]]:
    """The events left at the end of the file, ``]``, and the members after the array."""
    body = buf.lstrip(_WS)
    if body.startswith(b"]"):                   # an empty array, or nothing left after a cut
        if not first:
            raise Fallback("an array ending in a comma")
        rest = body[1:]
        events: list[Event] = []
    else:
        tries = 0
        ends = [m.start() + 1 for m in _END.finditer(buf, max(0, len(buf) - (1 << 20)))]
        for end in reversed(ends):
            tries += 1
            if tries > CUT_TRIES:
                break
            try:
                events = _decode(b"[" + buf[:end] + b"]")
            except Fallback:
                continue
            rest = buf[end:].lstrip(_WS)[1:]
            break
        else:
            raise Fallback("the end of traceEvents does not decode")
    rest = rest.rstrip(_WS)
    if not rest.endswith(b"}"):
        raise Fallback("no end of the top-level object")
    rest = rest[:-1]
    if rest.strip(_WS) and not rest.lstrip(_WS).startswith(b","):
        raise Fallback("no comma after traceEvents")
    _members(rest, on_header)
    if events:
        yield events
