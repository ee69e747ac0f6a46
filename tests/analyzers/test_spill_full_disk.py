"""A disk that fills during a diagnosis in windows (issue 47): whatever point of the spill the
``ENOSPC`` meets — its first write, the middle, its last write, the closing of its files — the
command says so in one line naming the spill folder and the OS's words, exits 2, and leaves nothing
of the spill under ``$TMPDIR`` (a user's file there stays). Before: exit 1 with ``BufferError:
cannot close exported pointers exist`` (the cleanup's error in place of the full disk).

The full disk is simulated (``_full_disk.py``: the spill's writes raise ``ENOSPC`` past N bytes)
around the real ``srtscope`` entry point, in a process of its own."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gen_nsys import generate
from srtscope.analyzers.model.timeline import SourceFormat
from srtscope.analyzers.readers.memory_estimate import estimate
from srtscope.analyzers.spill import spill_writes
from srtscope.analyzers.spill.nsys_spill import read_nsys_spilled

FULL_DISK = Path(__file__).with_name("_full_disk.py")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def over_budget(tmp_path_factory) -> tuple[Path, str, int]:
    """A small generated export, a budget that has it diagnosed in windows, and the bytes its spill
    writes in all."""
    export = tmp_path_factory.mktemp("gen") / "gen.sqlite"
    generate(export, 4)
    budget = str(estimate(export, SourceFormat.NSYS_SQLITE).peak_bytes // 2)
    counted = [0]
    real = os.pwritev

    def counting(fd, bufs, offset):
        counted[0] += sum(memoryview(b).nbytes for b in bufs)
        return real(fd, bufs, offset)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spill_writes.os, "pwritev", counting)
        read_nsys_spilled(export, folder=tmp_path_factory.mktemp("count")).close()
    assert counted[0] > 0
    return export, budget, counted[0]


def _diagnose(export: Path, budget: str, tmp: Path, limit: int, close_errno: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FULL_DISK), str(limit), str(close_errno), "diagnose", str(export),
                           "--json", "--no-cache", "--memory-budget", budget],
                          env={**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=TIMEOUT_S)


CASES = {   # where the disk fills: (bytes the spill may write, of ``total``; the errno closing its files gives)
    "the first write": (lambda total: 0, 0),
    "mid-spill": (lambda total: total // 2, 0),
    "the last write": (lambda total: total - 1, 0),
    "closing its files, every write done": (lambda total: -1, errno.ENOSPC),
    "mid-spill, and closing fails too": (lambda total: total // 2, errno.EIO),
}


@pytest.mark.parametrize("where", CASES)
def test_a_full_disk_mid_spill_is_one_line_exit_2_and_nothing_left(over_budget, tmp_path, where):
    export, budget, total = over_budget
    limit, close_errno = CASES[where]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "users-file.txt").write_text("not srtscope's")
    run = _diagnose(export, budget, tmp, limit(total), close_errno)
    lines = run.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("srtscope: error: ")]
    assert run.returncode == 2, (where, run.returncode, run.stderr[-3000:])
    assert len(errors) == 1, run.stderr
    assert all(ln.startswith(("srtscope: error: ", "srtscope: note: ")) for ln in lines), run.stderr
    assert f"cannot write the spill in {tmp}{os.sep}srtscope-spill-" in errors[0], errors[0]
    assert "No space left on device" in errors[0] and "set TMPDIR" in errors[0], errors[0]
    assert run.stdout == ""
    assert [p.name for p in tmp.iterdir()] == ["users-file.txt"]


def test_without_a_fault_the_same_run_answers(over_budget, tmp_path):
    """The harness itself changes nothing: no fault, the diagnosis in windows is printed."""
    export, budget, _ = over_budget
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = _diagnose(export, budget, tmp, -1)
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"verdict"' in run.stdout
    assert not list(tmp.iterdir())


def test_a_spill_folder_that_cannot_be_made_is_one_line_exit_2(over_budget, tmp_path, monkeypatch):
    """The disk already full when the spill's folder is made (in this process: ``CliRunner``)."""
    from typer.testing import CliRunner

    from srtscope.analyzers.spill import spill_folder
    from srtscope.cli.app import app

    class Full:
        def TemporaryDirectory(self, *args, **kwargs):  # noqa: N802 - tempfile's name
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    export, budget, _ = over_budget
    monkeypatch.setattr(spill_folder, "tempfile", Full())
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)           # TMPDIR read again
    r = CliRunner().invoke(app, ["diagnose", str(export), "--json", "--no-cache", "--memory-budget", budget])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("srtscope: error: ")]
    assert r.exit_code == 2 and len(errors) == 1, (r.exit_code, r.stderr, r.exception)
    assert f"cannot write the spill in {tmp_path}: No space left on device" in errors[0], errors[0]
