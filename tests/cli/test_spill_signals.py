"""A diagnosis in windows ended by SIGTERM: its spill removed, no forked walk left, one line and
exit 143 (the folder itself: ``tests/analyzers/test_spill_folder.py``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gen_nsys import generate
from srtscope.analyzers.model.timeline import SourceFormat
from srtscope.analyzers.readers.memory_estimate import estimate
from srtscope.analyzers.spill.spill_folder import PREFIX


@pytest.fixture(scope="module")
def over_budget(tmp_path_factory) -> tuple[Path, str]:
    """A generated export and a budget just under its whole read's estimate: diagnosed in windows."""
    export = tmp_path_factory.mktemp("gen") / "gen.sqlite"
    generate(export, 20)
    return export, str(estimate(export, SourceFormat.NSYS_SQLITE).peak_bytes - (1 << 20))


def _diagnose(over_budget: tuple[Path, str], tmp: Path, **env: str) -> subprocess.Popen:
    """``diagnose --json`` of the export in windows, spilling under ``tmp``, as a child process."""
    export, budget = over_budget
    tmp.mkdir()
    return subprocess.Popen([sys.executable, "-m", "srtscope.cli.app", "diagnose", str(export), "--json",
                             "--no-cache", "--memory-budget", budget], env={**os.environ, "TMPDIR": str(tmp), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_during_the_spill_removes_it_and_exits_143(over_budget, tmp_path):
    tmp = tmp_path / "tmp"
    p = _diagnose(over_budget, tmp)
    deadline = time.monotonic() + 60
    while not list(tmp.glob(PREFIX + "*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    # stopped as soon as its spill folder exists: the signal lands while the folder is in use
    p.send_signal(signal.SIGSTOP)
    assert list(tmp.glob(PREFIX + "*")), "the run ended before it spilled"
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "srtscope: interrupted (SIGTERM)", err
    assert not list(tmp.iterdir())


def _forks(pid: int) -> list[int]:
    """The children of ``pid`` that are copies of it (the same command line)."""
    out: list[int] = []
    try:
        me = Path(f"/proc/{pid}/cmdline").read_bytes()
        for t in Path(f"/proc/{pid}/task").glob("*/children"):
            out += [int(c) for c in t.read_text().split() if Path(f"/proc/{c}/cmdline").read_bytes() == me]
    except OSError:
        pass
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_sigterm_while_a_forked_walk_runs_leaves_no_process_and_no_spill(over_budget, tmp_path):
    tmp = tmp_path / "tmp"
    p = _diagnose(over_budget, tmp, SRTSCOPE_WINDOW_WALKS="2")
    deadline = time.monotonic() + 120
    kids: list[int] = []
    while not kids and p.poll() is None and time.monotonic() < deadline:
        kids = _forks(p.pid)
        time.sleep(0.002)
    # the second walk forked: the caller stopped there, ended by SIGTERM
    p.send_signal(signal.SIGSTOP)
    assert kids, "no second walk was forked"
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert not list(tmp.iterdir())
    # killed and reaped by the caller before it exits, wherever the signal landed
    assert not [k for k in kids if Path(f"/proc/{k}").exists()]
