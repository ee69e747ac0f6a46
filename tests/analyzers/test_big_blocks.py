"""numpy's big arrays from one region whose freed pages are reused (``analyzers/big_blocks.py``).

Each case runs in a fresh interpreter: the region is set up once per process and numpy's handler
stays set in it. Each asserts what the reading relies on: the values an array holds (zeros from
``np.zeros`` on reused pages, contents kept through a resize, arrays of other threads and of a
forked copy), that a freed block's pages are taken again instead of new ones, that ``give_back``
returns them to the system, and that the module steps aside where asked to.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from srtscope.analyzers import big_blocks

pytestmark = pytest.mark.skipif(big_blocks._c is None, reason="the C module was not built")

PRELUDE = """
import numpy as np
from srtscope.analyzers import big_blocks as b
from numpy._core.multiarray import get_handler_name
MIB = 1 << 20
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
assert b.start()
"""

CASES = {
    # a freed block's place is taken by the next array of its size or less: the region does not grow
    "reused": """
        a = np.ones(8 * MIB // 8)
        assert get_handler_name(a) == "srtscope_big_blocks"
        top = b._c.stats()[0]
        del a
        assert b.spare_bytes() >= 8 * MIB
        c = np.empty(6 * MIB // 8)
        c[:] = 1
        assert b._c.stats()[0] == top, (b._c.stats(), top)
    """,
    # zeros asked for on pages an earlier array wrote are zeros
    "zeros on reused pages": """
        a = np.full(4 * MIB, 7, np.uint8)
        del a
        z = np.zeros(4 * MIB, np.uint8)
        assert not z.any()
        z[:] = 9
        del z
        z = np.zeros(3 * MIB, np.uint8)
        assert not z.any()
    """,
    # freed neighbours merge: two halves freed make room for one array of both sizes
    "neighbours merge": """
        a, c = np.ones(4 * MIB // 8), np.ones(4 * MIB // 8)
        top = b._c.stats()[0]
        del a, c
        d = np.ones(8 * MIB // 8 - 1024)
        assert b._c.stats()[0] == top, (b._c.stats(), top)
    """,
    # a resize keeps what fits, shrinking in place frees the tail, growing moves or extends
    "resize keeps the values": """
        a = np.arange(MIB, dtype=np.int64)
        a.resize(MIB // 4, refcheck=False)
        assert (a == np.arange(MIB // 4)).all()
        assert b.spare_bytes() >= 6 * MIB
        other = np.ones(MIB)
        a.resize(4 * MIB, refcheck=False)
        assert (a[:MIB // 4] == np.arange(MIB // 4)).all() and not a[MIB // 4:].any()
        assert other.sum() == MIB
    """,
    # small arrays stay with the C library
    "small arrays unchanged": """
        s = np.ones(1000)
        assert s.sum() == 1000 and b._c.stats()[1] == 0
    """,
    # a thread takes the region's arrays once it asks, and its values are its own
    "threads": """
        import threading
        out = []
        def work():
            out.append(b.use_here())
            x = np.full(2 * MIB, 3, np.int64)
            out.append((get_handler_name(x), int(x.sum())))
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert out.count(True) == 4 and out.count(("srtscope_big_blocks", 6 * MIB)) == 4, out
    """,
    # a forked copy allocates and frees in its own region, the caller's values untouched
    "fork": """
        import os
        a = np.full(4 * MIB, 5, np.int64)
        pid = os.fork()
        if pid == 0:
            c = np.full(8 * MIB, 2, np.int64)
            del a
            d = np.zeros(4 * MIB, np.int64)
            os._exit(0 if c.sum() == 16 * MIB and not d.any() else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0 and a.sum() == 20 * MIB
    """,
    # give_back: the free pages leave the process; what is taken next reads as zeros
    "give back": """
        a = np.ones(64 * MIB // 8)
        held = rss()
        del a
        assert rss() > held - 8 * MIB
        assert b.give_back() >= 64 * MIB and b.spare_bytes() == 0
        assert rss() < held - 48 * MIB
        z = np.zeros(64 * MIB // 8)
        assert not z.any()
    """,
    # a free run at the top grows into the untouched space above it: its pages are kept
    "the top run grows": """
        keep = np.ones(4 * MIB // 8)
        a = np.ones(8 * MIB // 8)
        top = b._c.stats()[0]
        del a
        assert b._c.fresh_bytes(12 * MIB) == 4 * MIB     # each block a page over its array (its header)
        c = np.full(12 * MIB // 8, 3.0)
        assert b._c.stats()[0] == top + 4 * MIB, (b._c.stats(), top)
        assert c.sum() == 3.0 * (12 * MIB // 8) and keep.sum() == 4 * MIB // 8
    """,
    # make_room: an array no free run holds has the free pages given back first, one that fits not
    "make room": """
        a, keep, c = np.ones(8 * MIB // 8), np.ones(MIB // 8), np.ones(8 * MIB // 8)
        del a, c                       # two free runs of 8 MiB apart, one of them at the top
        assert b._c.fresh_bytes(4 * MIB) == 0 and b.make_room(4 * MIB) == 0 and b.spare_bytes() > 0
        assert b._c.fresh_bytes(40 * MIB) == 32 * MIB
        held = rss()
        assert b.make_room(40 * MIB) >= 16 * MIB and b.spare_bytes() == 0
        assert rss() < held - 12 * MIB
        big = np.zeros(40 * MIB // 8)
        assert not big.any() and keep.sum() == MIB // 8
    """,
}


def _run(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("case", list(CASES))
def test_big_arrays_from_the_region(case: str) -> None:
    r = _run(CASES[case])
    assert r.returncode == 0, r.stderr[-2000:]


def test_switched_off_numpy_allocates_as_before() -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import numpy as np
        from srtscope.analyzers import big_blocks as b
        from numpy._core.multiarray import get_handler_name
        assert not b.start() and not b.use_here() and b.give_back() == 0 and b.spare_bytes() == 0
        assert get_handler_name(np.ones(1 << 22)) == "default_allocator"
    """)], capture_output=True, text=True, env={**os.environ, big_blocks.ENV: "0"}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
