"""The spill of a diagnosis in windows never outlives its run: removed when SIGTERM ends it, and
a killed run's folder removed by the next run — only ours, only when its owner is gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gen_nsys import generate
from srtscope.analyzers.readers.memory_estimate import estimate
from srtscope.analyzers.timeline import SourceFormat
from srtscope.cli.spill_folder import OWNER, PREFIX, _started, spill_folder, sweep_stale

SPILL_FILE = "device-0123456789ab.spool"
#: a spill file of an earlier version (a file per segment): swept as well
OLD_SPILL_FILE = "device-0123456789ab-0000003.arrow"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder(tmp: Path, name: str, owner: str | None, files: dict[str, bytes]) -> Path:
    d = tmp / f"{PREFIX}{name}"
    d.mkdir()
    if owner is not None:
        (d / OWNER).write_text(owner)
    for f, data in files.items():
        (d / f).write_bytes(data)
    return d


@pytest.mark.parametrize("case, owner, files, removed", [
    ("owner process gone, only spill files: a killed run's spill", "dead", {SPILL_FILE: b"x" * 5000}, True),
    ("an earlier version's spill, its owner gone", "dead",
     {OLD_SPILL_FILE: b"x" * 70, "api-0123456789ab.spool": b"y"}, True),
    ("a name like a spill's with more after it", "dead", {SPILL_FILE + ".bak": b"x"}, False),
    ("owner still running (this test)", "self", {SPILL_FILE: b"x"}, False),
    ("its pid now another process's (start time differs): the owner is gone", "reused", {SPILL_FILE: b"x"}, True),
    ("no owner file: not provably ours", None, {SPILL_FILE: b"x"}, False),
    ("a file srtscope never writes beside the spill", "dead", {SPILL_FILE: b"x", "notes.txt": b"mine"}, False),
])
def test_sweep_removes_only_a_dead_runs_own_spill(tmp_path, capsys, case, owner, files, removed):
    me = os.getpid()
    text = {"dead": f"{_dead_pid()} 1", "self": f"{me} {_started(me)}", "reused": f"{me} 1",
            None: None}[owner]
    d = _folder(tmp_path, "case", text, files)
    freed = sweep_stale(tmp_path)
    assert d.exists() != removed, case
    assert freed == (sum(map(len, files.values())) + len(text or "") if removed else 0), case
    assert ("removed" in capsys.readouterr().err) == removed, case


def test_sweep_leaves_a_link_named_like_a_spill(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / OWNER).write_text(f"{_dead_pid()} 1")
    (tmp_path / f"{PREFIX}link").symlink_to(target)
    assert sweep_stale(tmp_path) == 0
    assert (target / OWNER).exists()


def test_spill_folder_is_marked_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with spill_folder() as d:
        pid, started = (d / OWNER).read_text().split()
        assert int(pid) == os.getpid() and started == _started(os.getpid())
        assert sweep_stale(tmp_path) == 0          # a live run's folder is never swept
    assert not list(tmp_path.iterdir())


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
