"""The spill folder of a diagnosis in windows (``spill/spill_folder.py``): marked with its owner and
removed on leaving; a killed run's folder removed by the next run — only ours, only when its owner
is gone. (SIGTERM during a run: ``tests/cli/test_spill_signals.py``.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from srtscope.analyzers.spill.spill_folder import OWNER, PREFIX, _started, spill_folder, sweep_stale

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
def test_sweep_removes_only_a_dead_runs_own_spill(tmp_path, case, owner, files, removed):
    me = os.getpid()
    text = {"dead": f"{_dead_pid()} 1", "self": f"{me} {_started(me)}", "reused": f"{me} 1",
            None: None}[owner]
    d = _folder(tmp_path, "case", text, files)
    notes: list[str] = []
    freed = sweep_stale(tmp_path, notes.append)
    assert d.exists() != removed, case
    assert freed == (sum(map(len, files.values())) + len(text or "") if removed else 0), case
    assert [n.startswith("removed ") for n in notes] == ([True] if removed else []), case


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
