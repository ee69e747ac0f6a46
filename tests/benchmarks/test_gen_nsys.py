"""The generated export the scale benchmarks diagnose (``benchmarks/gen_nsys.py``) is physical: each
step ends with a stream sync, so a step's kernels end inside it and the next step starts after it;
step numbers run on across batches; the cached name carries the shape's version."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """Two ranks in one file, batches of 5 steps: 1 MB, 10 k kernels."""
    out = tmp_path_factory.mktemp("gen") / "tp2.sqlite"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_nsys.py"), "--size-mb", "1", "--gpus", "2",
                    "--batch-steps", "5", str(out)], check=True, capture_output=True, cwd=REPO)
    return out


def _steps(con: sqlite3.Connection) -> list[tuple[int, int, int, str]]:
    """(globalTid, start, end, text) of every ``loop.step`` range, by thread then start."""
    return con.execute("SELECT globalTid, start, end, text FROM NVTX_EVENTS WHERE text LIKE 'loop.step %'"
                       " ORDER BY globalTid, start").fetchall()


def test_steps_follow_each_other_and_hold_their_kernels(export: Path) -> None:
    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as con:
        steps = _steps(con)
        kernels = np.array(con.execute("SELECT globalPid, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall(),
                           np.int64)
    assert len(steps) == 2 * 25 and len({s[0] for s in steps}) == 2   # 25 steps per rank
    for tid in {s[0] for s in steps}:
        mine = [s for s in steps if s[0] == tid]
        starts, ends = np.array([s[1] for s in mine]), np.array([s[2] for s in mine])
        assert (starts[1:] >= ends[:-1]).all(), "a step starts before the one before it ended"
        # numbered on across batches of 5: 0..24, each once
        assert [int(s[3].split()[1].removeprefix("step=")) for s in mine] == list(range(25))
        # every kernel of the rank's process starts and ends inside one of its steps (the sync waits)
        pid = tid >> 24 << 24
        k = kernels[kernels[:, 0] == pid]
        at = np.searchsorted(starts, k[:, 1], side="right") - 1
        assert (at >= 0).all() and (k[:, 2] <= ends[at]).all(), "a kernel outlives its step"


def test_cached_name_carries_the_shape_version() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.gen_nsys import SHAPE_VERSION, cached_name

    assert cached_name(3000) == f"nsys_3000mb.v{SHAPE_VERSION}.sqlite"
    assert cached_name(2.5) == f"nsys_2.5mb.v{SHAPE_VERSION}.sqlite"
    assert cached_name(2000, gpus=2) == f"nsys_2000mb_2gpu.v{SHAPE_VERSION}.sqlite"   # never one rank's file
