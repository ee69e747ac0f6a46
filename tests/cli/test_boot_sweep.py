"""Nothing a killed capture leaves behind outlives the next capture: a SIGKILLed ``srtscope capture``
runs no clean-up, so its boot folder (srtscope's import path for the command) stays in the temp
folder; the next capture removes the folders whose capture is gone, and only those."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from srtscope.cli.capture_env import BOOT_OWNER, BOOT_PREFIX, boot_dir, sweep_boot_dirs


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _boot(tmp: Path, name: str, owner: str | None) -> Path:
    d = tmp / (BOOT_PREFIX + name)
    (d / "srtscope").mkdir(parents=True)
    if owner is not None:
        (d / BOOT_OWNER).write_text(owner)
    return d


def test_the_next_capture_removes_a_killed_captures_boot_folder(tmp_path, monkeypatch):
    import os
    killed = _boot(tmp_path, "killed", str(_dead_pid()))         # its capture was SIGKILLed
    running = _boot(tmp_path, "running", str(os.getpid()))       # a capture still running
    unknown = _boot(tmp_path, "unknown", None)                   # no owner said: never ours to judge
    garbled = _boot(tmp_path, "garbled", "not a pid")                # not ours to judge either
    other = tmp_path / "someone-else"                            # not a boot folder
    other.mkdir()
    assert sweep_boot_dirs(tmp_path) == [killed]
    assert not killed.exists() and running.exists() and unknown.exists() and garbled.exists()
    assert other.exists()

    # a capture sweeps before it makes its own, and its own says who owns it and is gone afterwards
    stale = _boot(tmp_path, "stale", str(_dead_pid()))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env: dict[str, str] = {}
    with boot_dir(env, "probe", tmp_path / "out", []) as folder:
        assert not stale.exists()
        assert (folder / BOOT_OWNER).read_text().split()[0] == str(os.getpid())
        assert env["PYTHONPATH"] == str(folder)
    assert not folder.exists() and running.exists()
