"""The later windows walked in a forked copy: its result comes back, its failure costs only time.

``forked.Beside`` runs a function in a copy of the process: the value comes back; a copy that raises,
exits or is killed gives None; leaving the block early leaves nothing running. The windowed diagnosis
with two workers gives the same JSON as with one, also when the copy fails (its windows are then
walked by the caller).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.pipeline import forked
from srtscope.analyzers.pipeline import stream as stream
from srtscope.analyzers.pipeline.stream import TimelineChunks, diagnose_streamed, split_at
from srtscope.analyzers.readers import load_timeline

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
REPO = Path(__file__).resolve().parents[2]


def _raise() -> None:
    raise ValueError("the copy fails")


def _exit() -> None:
    os._exit(3)


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("fn, want", [
    (lambda: {"rows": np.arange(5), "name": "x"}, {"rows": [0, 1, 2, 3, 4], "name": "x"}),   # the value back
    (lambda: None, None),             # a None result reads as None
    (_raise, None),                   # an exception in the copy: None, nothing printed
    (_exit, None),                    # the copy exits non-zero
    (_killed, None),                  # the copy is killed (out of memory, a signal)
])
def test_beside_gives_the_result_or_none(fn, want, capfd: pytest.CaptureFixture[str]) -> None:
    with forked.Beside(fn) as other:
        got = other.result()
    if isinstance(got, dict):
        got = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in got.items()}
    assert got == want
    assert capfd.readouterr().err == ""            # the copy writes nothing to the terminal


def test_leaving_early_kills_the_copy() -> None:
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with forked.Beside(lambda: time.sleep(60)) as other:
            pid = other.pid
            raise KeyboardInterrupt
    assert time.monotonic() - t0 < 10
    assert other.pid is None
    with pytest.raises(ChildProcessError):          # reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)


def test_a_signal_during_the_fork_kills_and_reaps_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM lands right as the fork returns (the CLI's handler raises): it still raises, once the
    copy is registered, and the copy is killed and reaped, not left to die with the caller."""
    real, pids = os.fork, []

    def fork() -> int:
        pid = real()
        if pid:
            pids.append(pid)
            os.kill(os.getpid(), signal.SIGTERM)
        return pid

    def unwind(signum, frame):
        raise KeyboardInterrupt
    before = signal.signal(signal.SIGTERM, unwind)
    monkeypatch.setattr(os, "fork", fork)
    try:
        with pytest.raises(KeyboardInterrupt):
            forked.Beside(lambda: time.sleep(60))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert pids
    with pytest.raises(ChildProcessError):          # reaped: no zombie, nothing running
        os.waitpid(pids[0], os.WNOHANG)
    assert pids[0] not in forked._live
    assert signal.getsignal(signal.SIGTERM) is before


def _caller_ending(tmp_path: Path, ending: str) -> tuple[int, int]:
    """A caller that starts a Beside no ``with`` block ends, then runs ``ending``: its exit status
    and the copy's pid."""
    import subprocess
    import sys

    code = ("import os, sys, time\n"
            "from srtscope.analyzers.pipeline.forked import Beside\n"
            "b = Beside(lambda: time.sleep(60))\n"
            f"open({str(tmp_path / 'pid')!r}, 'w').write(str(b.pid))\n"
            f"{ending}\n")
    rc = subprocess.run([sys.executable, "-c", code], timeout=30).returncode
    return rc, int((tmp_path / "pid").read_text())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc here")
def test_a_copy_left_unended_is_reaped_when_its_caller_exits(tmp_path: Path) -> None:
    """A Beside no ``with`` block ended: the caller's exit kills and reaps it before the caller is gone."""
    rc, pid = _caller_ending(tmp_path, "sys.exit(3)")
    assert rc == 3
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize("n, workers, want", [
    (10, 1, None),     # one worker: one walk
    (1, 2, None),      # one window: nothing to split
    (2, 2, 1),         # the copy walks the first window without analysing it, then the second
    (10, 2, 6),        # the copy repeats the carrying of the first 6 (REPLAY_SHARE of their time)
    (100, 2, 62),
])
def test_split_point(n: int, workers: int, want: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "available", lambda: True)
    assert split_at(n, workers) == want


def test_a_failed_copy_walks_its_windows_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy's window analysis fails: the caller walks every window itself, same JSON."""
    monkeypatch.setattr(stream, "available", lambda: True)
    tl = load_timeline([REPO / "sample_traces" / "host_sync_bound.sqlite"])
    params = DiagnoseParams()
    whole = diagnose(tl, params).to_json()
    me, calls = os.getpid(), []
    real = stream.window_part

    def part(*a, **k):
        if os.getpid() != me:
            raise RuntimeError("the copy fails")
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(stream, "window_part", part)
    assert diagnose_streamed(TimelineChunks(tl, 25), params, 40, workers=2).to_json() == whole
    n_here = len(calls)
    calls.clear()
    diagnose_streamed(TimelineChunks(tl, 25), params, 40, workers=1)
    assert n_here == len(calls) > 2                 # every window analysed here, none lost


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc here")
def test_the_copy_dies_with_its_caller(tmp_path: Path) -> None:
    """A caller killed outright (out of memory, SIGKILL) leaves no copy running on."""
    rc, pid = _caller_ending(tmp_path, "os.kill(os.getpid(), 9)")
    assert rc == -9
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)
    assert not _running(pid)
