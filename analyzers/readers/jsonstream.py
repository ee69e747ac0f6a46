"""Streaming reader of one large JSON object: the ``traceEvents`` array element by element.

Only the current buffer (about a megabyte plus the element being decoded) and the small top-level
values are held; the whole document is never parsed into memory at once.
NOTE: floats longer than 15 characters stay strings (``parse_float``) so that epoch-µs timestamps
with ns decimals convert to integer ns exactly; ``us_to_ns`` accepts both.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

_WS = " \t\r\n"
_MAX_CUT = 64 << 20  # longest element text (chars) that may straddle a chunk boundary


def _parse_float(s: str) -> float | str:
    return s if len(s) > 15 else float(s)


def us_to_ns(v: Any) -> int:
    """A microsecond value (int, float or exact decimal string) -> integer nanoseconds."""
    if isinstance(v, str):
        neg = v.startswith("-")
        body = v[1:] if neg else v
        if "e" in body or "E" in body:
            return round(float(v) * 1000)
        whole, _, frac = body.partition(".")
        ns = int(whole or "0") * 1000 + int((frac + "000")[:3])
        if len(frac) > 3 and frac[3] >= "5":
            ns += 1
        return -ns if neg else ns
    if isinstance(v, bool) or v is None:
        raise ValueError(f"not a time value: {v!r}")
    if isinstance(v, int):
        return v * 1000
    return round(float(v) * 1000)


STREAMED = "<streamed>"  # header value of the key whose array was streamed


class JsonStreamError(ValueError):
    pass


class _Buf:
    def __init__(self, fh: IO[str], chunk: int) -> None:
        self.fh, self.chunk = fh, chunk
        self.buf, self.pos, self.eof = "", 0, False
        self.dec = json.JSONDecoder(parse_float=_parse_float)

    def fill(self) -> bool:
        if self.eof:
            return False
        data = self.fh.read(max(self.chunk, len(self.buf) - self.pos))
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self.fill():
                return ""

    def expect(self, ch: str) -> None:
        got = self.peek()
        if got != ch:
            raise JsonStreamError(f"expected {ch!r} but found {got or 'end of file'!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # An error far before the end of the buffer is not an element cut by the chunk
                # boundary: report it now instead of reading the rest of the file into memory.
                if len(self.buf) - exc.pos < _MAX_CUT and self.fill():
                    continue
                raise JsonStreamError(f"invalid JSON ({exc.msg} near byte {exc.pos})") from None
            if end == len(self.buf) and not self.eof and self.fill():
                continue  # a number may continue in the next chunk
            self.pos = end
            return obj


def iter_trace(fh: IO[str], on_header: Callable[[str, Any], None],
               chunk: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of the top-level ``traceEvents`` array; other top-level keys go to
    ``on_header(key, value)``. Raises ``JsonStreamError`` on malformed or non-object JSON."""
    b = _Buf(fh, chunk)
    b.expect("{")
    if b.peek() == "}":
        b.pos += 1
        return
    while True:
        key = b.value()
        if not isinstance(key, str):
            raise JsonStreamError("malformed object key")
        b.expect(":")
        if key == "traceEvents" and b.peek() == "[":
            on_header(key, STREAMED)
            b.pos += 1
            if b.peek() == "]":
                b.pos += 1
            else:
                while True:
                    yield b.value()
                    c = b.peek()
                    b.pos += 1
                    if c == "]":
                        break
                    if c != ",":
                        raise JsonStreamError(f"expected ',' or ']' in traceEvents, "
                                              f"found {c or 'end of file'!r}")
        else:
            on_header(key, b.value())
        c = b.peek()
        b.pos += 1
        if c == "}":
            break
        if c != ",":
            raise JsonStreamError(f"expected ',' or '}}' at top level, found {c or 'end of file'!r}")
    if b.peek() != "":
        raise JsonStreamError("trailing data after the top-level object")
