"""Streaming reader of one large JSON object: the ``traceEvents`` array element by element.

Only the current buffer (about a megabyte plus the element being decoded) and the small top-level
values are held; the whole document is never parsed into memory at once. Whatever the inflated size
(gzip bombs), memory stays bounded: one value's text is capped (``MAX_VALUE_CHARS``), and so are a
run of whitespace between tokens (``MAX_WS_RUN``, skipped in bulk) and a number literal
(``MAX_NUMBER_CHARS``); ``load_columns`` reads a whole document (probe traces) element by element.
NOTE: floats longer than 15 characters stay strings (``parse_float``) so that epoch-µs timestamps
with ns decimals convert to integer ns exactly; ``us_to_ns`` accepts both.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

_WS = " \t\r\n"
MAX_VALUE_CHARS = 32 << 20   # longest text of one value (an event, a header value): ~5x that in memory
MAX_WS_RUN = 32 << 20        # longest run of whitespace between two tokens
MAX_NUMBER_CHARS = 64        # longest float literal (an int64 has 20 characters); ints: Python's
#                              int_max_str_digits (4300 by default), checked before conversion


def _parse_float(s: str) -> float | str:
    if len(s) > MAX_NUMBER_CHARS:
        raise JsonStreamError(f"a number literal of over {MAX_NUMBER_CHARS} characters")
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


class CutStreamError(JsonStreamError):
    """``iter_objects``: the input ended inside an object (a writer killed mid-write)."""


class _Buf:
    def __init__(self, fh: IO[str], chunk: int, max_value: int | None = None,
                 max_total: int | None = None) -> None:
        self.fh, self.chunk = fh, chunk
        self.buf, self.pos, self.eof = "", 0, False
        self.dec = json.JSONDecoder(parse_float=_parse_float)
        self.max_value = MAX_VALUE_CHARS if max_value is None else max_value
        self.max_total = max_total       # characters of the whole document (None: any)
        self.base = 0                    # characters dropped before ``buf``

    def fill(self) -> bool:
        if self.eof:
            return False
        data = self.fh.read(max(self.chunk, len(self.buf) - self.pos))
        if not data:
            self.eof = True
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        if self.max_total is not None and self.base + len(self.buf) > self.max_total:
            raise JsonStreamError(f"document longer than {self.max_total >> 20} MiB")
        return True

    def grow(self) -> bool:
        """``fill`` for a value cut by the buffer's end, unless it is already too long."""
        if len(self.buf) - self.pos >= self.max_value:
            raise JsonStreamError(f"a value longer than {self.max_value >> 20} MiB at character {self.base + self.pos}")
        return self.fill()

    def peek(self) -> str:
        run = 0
        while True:
            buf, pos = self.buf, self.pos
            if pos < len(buf) and buf[pos] not in _WS:
                return buf[pos]
            # NOTE: whitespace is skipped in bulk, in windows doubling from 64 characters (a short run
            # costs a short copy): str.lstrip runs at ~2 GB/s where a regex or a loop is 10-1000x slower.
            # It also skips the other characters str.isspace() knows, which JSON does not allow.
            w = 64
            while pos < len(buf):
                part = buf[pos:pos + w]
                k = len(part) - len(part.lstrip())
                pos += k
                if k < len(part):
                    break
                w = min(2 * w, 1 << 20)
            run += pos - self.pos
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if run > MAX_WS_RUN:
                raise JsonStreamError(f"a run of over {MAX_WS_RUN >> 20} MiB of whitespace "
                                      f"at character {self.base + self.pos}")
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
            except JsonStreamError:
                raise
            except json.JSONDecodeError as exc:
                # An error far before the end of the buffer is not an element cut by the chunk
                # boundary: report it now instead of reading the rest of the file into memory.
                if len(self.buf) - exc.pos < self.max_value and self.grow():
                    continue
                if exc.msg.startswith("Unterminated string"):
                    raise JsonStreamError(f"invalid JSON (a string unterminated or longer than "
                                          f"{self.max_value >> 20} MiB at character {self.base + exc.pos})") from None
                raise JsonStreamError(f"invalid JSON ({exc.msg} near character "
                                      f"{self.base + exc.pos})") from None
            except ValueError:   # an int literal over Python's int_max_str_digits
                raise JsonStreamError(f"a number literal too long at character {self.base + self.pos}") from None
            if end == len(self.buf) and not self.eof and self.grow():
                continue  # a number may continue in the next chunk
            self.pos = end
            return obj


def iter_trace(fh: IO[str], on_header: Callable[[str, Any], None],
               chunk: int = 1 << 20, max_value: int | None = None) -> Iterator[Any]:
    """Yield the elements of the top-level ``traceEvents`` array; other top-level keys go to
    ``on_header(key, value)``. Raises ``JsonStreamError`` on malformed or non-object JSON, and on a
    value longer than ``max_value`` characters (default ``MAX_VALUE_CHARS``)."""
    b = _Buf(fh, chunk, max_value)
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


_PACK = 1 << 16   # elements converted to an int64 array at a time


def _pack(vals: list) -> list | np.ndarray:
    """A chunk of array elements: int64 when all are ints (8 bytes each, not ~40), else as is."""
    if vals and all(type(v) is int for v in vals):
        try:
            return np.array(vals, dtype=np.int64)
        except OverflowError:
            pass
    return vals


def _array(b: _Buf, where: str, max_rows: int) -> list | np.ndarray:
    """The elements of the array whose ``[`` was just consumed: an int64 array when all are ints."""
    chunks: list[list | np.ndarray] = []
    cur: list = []
    n = 0
    if b.peek() == "]":
        b.pos += 1
        return []
    while True:
        cur.append(b.value())
        n += 1
        if n > max_rows:
            raise JsonStreamError(f"{where} holds more than {max_rows} elements")
        if len(cur) == _PACK:
            chunks.append(_pack(cur))
            cur = []
        c = b.peek()
        b.pos += 1
        if c == "]":
            break
        if c != ",":
            raise JsonStreamError(f"expected ',' or ']' in {where}, found {c or 'end of file'!r}")
    chunks.append(_pack(cur))
    if all(isinstance(c, np.ndarray) for c in chunks):
        return np.concatenate(chunks)
    out: list = []
    for part in chunks:
        out.extend(part.tolist() if isinstance(part, np.ndarray) else part)
    return out


def _object(b: _Buf, where: str, depth: int, max_rows: int) -> dict[str, Any]:
    """The members of the object whose ``{`` was just consumed; arrays (and, while ``depth`` > 0,
    objects) among them are read element by element."""
    out: dict[str, Any] = {}
    if b.peek() == "}":
        b.pos += 1
        return out
    while True:
        if b.peek() != '"':
            raise JsonStreamError(f"malformed object key in {where}")
        key = b.value()
        b.expect(":")
        c = b.peek()
        if c == "[":
            b.pos += 1
            out[key] = _array(b, f"{where}.{key}" if where else key, max_rows)
        elif c == "{" and depth > 0:
            b.pos += 1
            out[key] = _object(b, f"{where}.{key}" if where else key, depth - 1, max_rows)
        else:
            out[key] = b.value()
        c = b.peek()
        b.pos += 1
        if c == "}":
            return out
        if c != ",":
            raise JsonStreamError(f"expected ',' or '}}' in {where}, found {c or 'end of file'!r}")


def load_columns(fh: IO[str], max_rows: int, max_total: int | None = None, chunk: int = 1 << 20,
                 max_value: int | None = None) -> dict[str, Any]:
    """One top-level JSON object, read element by element: its arrays, and those of the objects it
    holds (columns), come back as lists, or int64 arrays when all their elements are ints. Bounded:
    ``max_rows`` elements per array, ``max_total`` characters in all, ``max_value`` per element."""
    b = _Buf(fh, chunk, max_value, max_total)
    b.expect("{")
    doc = _object(b, "", 1, max_rows)
    if b.peek() != "":
        raise JsonStreamError("trailing data after the top-level object")
    return doc


def iter_objects(fh: IO[str], max_rows: int, max_total: int | None = None, chunk: int = 1 << 20,
                 max_value: int | None = None) -> Iterator[dict[str, Any]]:
    """Top-level JSON objects one after another (JSON Lines, or simply concatenated), each read as
    ``load_columns`` reads one; the bounds hold per array (``max_rows``) and over the whole stream
    (``max_total``). Each object is yielded as soon as it is closed, before the next is looked for,
    so a stream cut in its last object still gives every object before it."""
    b = _Buf(fh, chunk, max_value, max_total)
    while b.peek() != "":
        try:
            b.expect("{")
            doc = _object(b, "", 1, max_rows)
        except JsonStreamError as exc:
            if b.eof:        # the input ended inside this object
                raise CutStreamError(str(exc)) from None
            raise
        yield doc
