"""The library floor of reading a Kineto trace: ISA-L gunzip + msgspec typed decode of ``traceEvents``.

    .venv/bin/python benchmarks/peers/kineto_decode_floor.py TRACE.json.gz     # prints {"events": N}

The whole document inflated at once (``isal.igzip``), then decoded in one call into structs holding
only the members srtscope's reader uses (``ts`` / ``dur`` as floats, ``args`` four fields): what the
libraries alone cost, nothing kept, no columns made. Memory: the document and its structs at once.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
from isal import igzip


class Args(msgspec.Struct, gc=False):
    correlation: Any = None
    device: Any = None
    stream: Any = None
    bytes: Any = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = 0
    dur: Any = 0
    id: Any = None
    args: Args | None = None


class Trace(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []


def main(path: str) -> int:
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    text = igzip.open(path, "rb").read() if gz else open(path, "rb").read()
    doc = msgspec.json.decode(text, type=Trace)
    print(json.dumps({"events": len(doc.traceEvents), "bytes": len(text)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
