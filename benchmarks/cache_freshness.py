"""What each way of telling "this trace changed" costs on a large export, and which changes it sees.

    python benchmarks/gen_nsys.py --size-mb 1000 /tmp/srtscope_1000mb.sqlite
    python benchmarks/cache_freshness.py --trace /tmp/srtscope_1000mb.sqlite [--runs 5]

Each option runs on the warm file (in the page cache, as on a second look), medians of ``--runs``,
side by side with ``stat`` alone (the floor). Then a copy of the first 64 MiB gets one byte
rewritten in the middle with its mtime restored (``touch -r``), and each option says whether it
sees the change. The cache uses the full xxh3-128 hash (``cache_store.trace_key``) plus ctime.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CHUNK = 256 << 10


def stat_only(p: Path) -> object:
    st = os.stat(p)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def ctime(p: Path) -> object:
    st = os.stat(p)
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def ends_64k(p: Path) -> object:
    """The former key: SHA-1 of the first and last 64 KiB."""
    h = hashlib.sha1(usedforsecurity=False)
    with open(p, "rb") as fh:
        h.update(fh.read(64 << 10))
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - (64 << 10)))
        h.update(fh.read(64 << 10))
    return h.hexdigest()


def sqlite_header(p: Path) -> object:
    """SQLite's file change counter (offset 24) and page count (offset 28)."""
    with open(p, "rb") as fh:
        head = fh.read(100)
    return struct.unpack(">II", head[24:32])


def sampled(p: Path, pages: int = 1024, page: int = 4096) -> object:
    """``pages`` pages spread evenly over the file."""
    h = hashlib.sha1(usedforsecurity=False)
    size = os.stat(p).st_size
    with open(p, "rb") as fh:
        for i in range(pages):
            fh.seek(size * i // pages)
            h.update(fh.read(page))
    return h.hexdigest()


def full(new: Callable[[], object]) -> Callable[[Path], object]:
    def run(p: Path) -> object:
        h = new()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(p, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])  # type: ignore[attr-defined]
        return h.hexdigest()  # type: ignore[attr-defined]
    return run


def options() -> dict[str, Callable[[Path], object]]:
    out: dict[str, Callable[[Path], object]] = {
        "stat (size, mtime, inode)": stat_only, "stat + ctime": ctime,
        "first + last 64 KiB (SHA-1)": ends_64k, "SQLite header counter + pages": sqlite_header,
        "1024 sampled 4 KiB pages": sampled,
        "whole file, BLAKE2b": full(lambda: hashlib.blake2b(digest_size=16)),
        "whole file, SHA-1": full(lambda: hashlib.sha1(usedforsecurity=False)),
    }
    try:
        import xxhash
        out["whole file, xxh3-128 (used)"] = full(xxhash.xxh3_128)
    except ImportError:
        pass
    return out


def sees_mid_file_rewrite(fn: Callable[[Path], object], src: Path) -> bool:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.sqlite"
        with open(src, "rb") as a, open(p, "wb") as b:
            b.write(a.read(64 << 20))
        before = fn(p)
        st = os.stat(p)
        with open(p, "r+b") as fh:
            fh.seek(st.st_size * 37 // 100 + 12_345)            # between any two sampled pages
            old = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([old[0] ^ 0xFF]))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))       # touch -r
        return fn(p) != before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    size = a.trace.stat().st_size
    opts = options()
    full(hashlib.sha1)(a.trace)                                   # warm the page cache
    print(f"{a.trace} ({size / 1e6:.0f} MB), medians of {a.runs}, warm page cache\n")
    print("| option | time per look | per GB | sees a mid-file rewrite with mtime restored |")
    print("|---|---:|---:|---|")
    for name, fn in opts.items():
        times = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            fn(a.trace)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        seen = "yes" if sees_mid_file_rewrite(fn, a.trace) else "**no**"
        print(f"| {name} | {t * 1e3:.1f} ms | {t / (size / 1e9) * 1e3:.1f} ms | {seen} |")
    print(f"\n{os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
