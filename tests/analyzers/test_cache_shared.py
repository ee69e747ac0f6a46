"""A cache folder shared between users (issue 47): a sticky, world-writable folder such as a
``/tmp`` one. The audit: another user's entries under your names could not be removed, so every look
recomputed and printed two warnings. Now each user keeps their own ``user-<uid>`` folder inside a
shared one and never sees the others'. And a kept answer signed with your own key never prints a
string past the 4096 characters an answer may hold."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.analyzers.cache import cache_store as S
from srtscope.analyzers.cache.cache_auth import mac, user_key
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "launch.sqlite"
    shutil.copyfile(SAMPLES / "launch_bound_eager.sqlite", p)
    return p


@pytest.fixture
def shared() -> Path:
    """The cache folder as a sticky folder anyone may write (mode 1777)."""
    root = S.cache_dir()
    root.mkdir(parents=True)
    os.chmod(root, 0o1777)
    return root


def _diagnose(trace: Path):
    r = CliRunner().invoke(app, ["diagnose", "--json", str(trace)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), [ln for ln in r.stderr.splitlines() if ln]


def test_a_shared_folder_keeps_this_users_entries_in_their_own(trace, shared):
    """Scenario: shared folder. Entries go to ``user-<uid>`` (mode 0700); the second look is answered
    from it (the table and answer entries are not rewritten)."""
    truth, notes = _diagnose(trace)
    mine = shared / f"user-{os.getuid()}"
    assert notes == [] and mine.is_dir() and (mine.stat().st_mode & 0o777) == 0o700
    assert [p.name for p in shared.iterdir()] == [mine.name]
    kept = {p.name: p.stat().st_ino for p in mine.iterdir()}
    assert any(n.startswith("diagnosis-") for n in kept)
    again, notes = _diagnose(trace)
    assert again == truth and notes == []
    assert {p.name: p.stat().st_ino for p in mine.iterdir()} == kept


def test_another_users_entries_in_the_shared_folder_are_never_seen(trace, shared, tmp_path):
    """Scenario: another user already diagnosed the same trace into the shared folder, with their
    own key, and their folders cannot be removed by us: no warning, no recompute on the second look."""
    truth, _ = _diagnose(trace)
    mine = shared / f"user-{os.getuid()}"
    for entry in list(mine.iterdir()):       # the other user's copies, at the shared folder's top
        shutil.copytree(entry, shared / entry.name)
    (answer,) = shared.glob("diagnosis-*")
    stored = json.loads((answer / S.META).read_text())
    stored["doc"]["verdict"]["summary"] = "written by mallory"
    (answer / S.META).write_text(json.dumps(stored))
    first, notes = _diagnose(trace)
    assert first == truth and notes == []
    assert (shared / answer.name).is_dir()          # left alone


def test_a_squatted_user_folder_is_not_used_one_warning(trace, shared):
    """Scenario: someone made this user's folder in the shared one, writable by all: never used (the
    answer is still computed), one warning line."""
    squat = shared / f"user-{os.getuid()}"
    squat.mkdir()
    os.chmod(squat, 0o777)
    truth, notes = _diagnose(trace)
    assert truth["verdict"]["bottleneck"]
    assert notes == [f"srtscope: warning: srtscope cache not used: {squat} is not a folder of this "
                     "user's that only they may write"]
    assert list(squat.iterdir()) == []


def test_a_kept_answer_with_an_overlong_string_is_recomputed(trace):
    """Scenario: a kept answer signed with this user's own key (our own bug, say) holding a 100 kB
    string: the contract refuses it behind the MAC; the answer is recomputed, never printed."""
    truth, _ = _diagnose(trace)
    (entry,) = S.cache_dir().glob("diagnosis-*")
    stored = json.loads((entry / S.META).read_text())
    stored["doc"]["verdict"]["summary"] = "x" * 100_000
    meta = json.dumps(stored).encode()
    (entry / S.META).write_bytes(meta)
    marker = json.loads((entry / S.MARKER).read_text())
    marker["mac"] = mac(user_key(S.cache_dir()), b"answer", entry.name.encode(), meta)
    (entry / S.MARKER).write_text(json.dumps(marker))
    again, notes = _diagnose(trace)
    assert again == truth and notes == []
