"""The caches under hostile conditions (issue 26's audit): never delete what srtscope did not make,
never answer from a stale, forged or damaged entry, never hang on what is put in the cache folder.
Each test reproduces one audit case and shows it clean."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.analyzers.cache import cache_store as S
from srtscope.analyzers.cache.cache_auth import key_path, mac, user_key
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def trace(tmp_path) -> Path:
    """192 KiB: its middle lies outside the first and last 64 KiB the former key sampled."""
    p = tmp_path / "launch.sqlite"
    shutil.copyfile(SAMPLES / "launch_bound_eager.sqlite", p)
    return p


def _cli(*args: str | Path, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def _json(*args: str | Path) -> dict:
    r = _cli("diagnose", "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _root() -> Path:
    return S.cache_dir()


def _answer() -> Path:
    (entry,) = _root().glob("diagnosis-*")
    return entry


def _resign(entry: Path, kind: str) -> None:
    """Sign ``entry`` again with this user's key: a damaged entry that the MAC cannot tell (our own
    bug, say), so that the checks behind the MAC are what is tested."""
    marker = json.loads((entry / S.MARKER).read_text())
    marker["mac"] = mac(user_key(_root()), kind.encode(), entry.name.encode(), (entry / S.META).read_bytes())
    (entry / S.MARKER).write_text(json.dumps(marker))


# -- 1. ownership ------------------------------------------------------------------------------------
FOREIGN = ["0f" * 16, "diagnosis-" + "ab" * 16, ".tmp-somebody-elses", "photos"]


def _plant_foreign(root: Path) -> list[Path]:
    made = []
    for name in FOREIGN:
        d = root / name
        d.mkdir(parents=True)
        (d / "meta.json").write_text('{"key": {}}')
        (d / "precious.bin").write_bytes(b"x" * 4096)
        made.append(d)
    return made


def test_folders_named_like_entries_survive_eviction_and_clear(trace, tmp_path, monkeypatch):
    """The audit: an md5-named folder in the cache folder was deleted by eviction, silently."""
    foreign = _plant_foreign(_root())
    _json(trace)
    one_look = sum(b for _, b, _ in S.CacheStore().entries())
    monkeypatch.setattr(S, "max_bytes", lambda: one_look + 1024)     # room for one trace's entries
    other = tmp_path / "other.sqlite"
    shutil.copyfile(SAMPLES / "launch_bound_eager.sqlite", other)
    r = _cli("diagnose", "--json", other)
    assert r.exit_code == 0
    assert "evicted down to the cap; left alone 4 items srtscope did not make" in r.stderr
    assert len(S.CacheStore().entries()) < 4                          # eviction did run
    r = _cli("cache", "--clear")
    assert r.exit_code == 0, r.output
    assert "entries removed" in r.stdout and "left alone: 4 items srtscope did not make" in r.stdout
    assert all((d / "precious.bin").read_bytes() == b"x" * 4096 for d in foreign)
    assert sorted(p.name for p in _root().iterdir()) == sorted(FOREIGN)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("writer, age_s, reclaimed", [
    ("dead", 0, True),            # SIGKILLed a moment ago: its pid runs no more on this host
    ("alive", 0, False),          # a srtscope writing now
    ("alive", 2 * S.STALE_TMP_S, True),   # nothing written there for two hours
    ("other-host", 0, False),     # cannot tell yet whether it lives
])
def test_killed_writers_temp_folders_are_listed_and_reclaimed(trace, writer, age_s, reclaimed):
    import socket

    tmp = _root() / ".tmp-abc123"
    tmp.mkdir(parents=True)
    pid = _dead_pid() if writer == "dead" else os.getpid()
    host = "elsewhere" if writer == "other-host" else socket.gethostname()
    (tmp / S.MARKER).write_text(json.dumps({"owner": S.OWNER, "store": S.STORE_FORMAT, "kind": "writing",
                                            "host": host, "pid": pid}))
    (tmp / "device.arrow").write_bytes(b"\0" * 100_000)
    if age_s:
        then = time.time() - age_s
        for p in (tmp / S.MARKER, tmp / "device.arrow", tmp):
            os.utime(p, (then, then))
    listing = _cli("cache")
    assert listing.exit_code == 0
    assert ("leftover" in listing.stdout) == reclaimed
    assert ("being written now" in listing.stdout) == (not reclaimed)
    r = _cli("cache", "--clear")
    assert r.exit_code == 0, r.output
    assert tmp.exists() != reclaimed
    if reclaimed:
        assert "1 leftover of killed runs" in r.stdout


def test_a_write_reclaims_a_killed_writers_leftover(trace):
    tmp = _root() / ".tmp-killed"
    tmp.mkdir(parents=True)
    (tmp / S.MARKER).write_text(json.dumps({"owner": S.OWNER, "store": S.STORE_FORMAT, "kind": "writing",
                                            "host": __import__("socket").gethostname(), "pid": _dead_pid()}))
    _json(trace)
    assert not tmp.exists()


# -- 2. freshness ------------------------------------------------------------------------------------
def test_a_mid_file_rewrite_with_mtime_restored_is_a_miss(trace, tmp_path):
    """The audit: bytes rewritten in the middle, size kept, ``touch -r`` restoring the mtime, got the
    old answer from both caches (the key sampled only the first and last 64 KiB)."""
    first = _json(trace)
    changed = tmp_path / "changed.sqlite"
    shutil.copyfile(trace, changed)
    con = sqlite3.connect(changed)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start + (end - start) * 3")
    con.commit()
    con.close()
    middle = changed.read_bytes()[64 << 10: 128 << 10]
    st = trace.stat()
    assert st.st_size == changed.stat().st_size == 192 << 10
    with open(trace, "r+b") as fh:                       # in place: same inode, same size
        fh.seek(64 << 10)
        fh.write(middle)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))   # touch -r
    assert trace.stat().st_mtime_ns == st.st_mtime_ns
    fresh = _json("--no-cache", trace)
    assert fresh != first, "the rewrite must change the answer for this test to mean anything"
    assert _json(trace) == fresh                         # the answer cache missed
    assert _json("--threshold-us", "6", trace) == _json("--no-cache", "--threshold-us", "6", trace)  # the tables too


# -- 3. integrity and authenticity -------------------------------------------------------------------
def _edit(doc: dict, how: str) -> None:
    if how == "bottleneck":
        doc["verdict"]["bottleneck"] = "prep"
    elif how == "empty":
        doc.clear()
    elif how == "nan":
        doc["bubbles"]["total_ns"] = float("nan")
    elif how == "wrong_type":
        doc["verdict"] = "prep"
    elif how == "missing_key":
        del doc["steps"]
    elif how == "infinite":
        doc["verdict"]["confidence"] = float("inf")


@pytest.mark.parametrize("resigned", [False, True], ids=["edited", "edited-and-resigned"])
@pytest.mark.parametrize("how", ["bottleneck", "empty", "nan", "wrong_type", "missing_key", "infinite"])
def test_an_edited_answer_is_never_printed(trace, tmp_path, how, resigned):
    """The audit: a hand-edited answer was printed as the diagnosis (text, JSON, HTML, Markdown); ``{}``
    printed a blank report; NaN came out as ``NaN``. Now: not verified (a note), or refused by the
    contract check behind the MAC: recomputed either way."""
    truth = _json(trace)
    entry = _answer()
    stored = json.loads((entry / S.META).read_text())
    _edit(stored["doc"], how)
    (entry / S.META).write_text(json.dumps(stored))
    if resigned:
        _resign(entry, "answer")
    md = tmp_path / "r.md"
    r = _cli("diagnose", "--json", "--markdown", md, trace)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == truth
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout
    assert f"**Bottleneck: {truth['verdict']['bottleneck'].upper()}" in md.read_text()
    notes = [ln for ln in r.stderr.splitlines() if ln]
    assert notes == ([] if resigned else
                     [f"srtscope: warning: srtscope cache: ignored entry {entry.name} (not written by this "
                      "user's srtscope, or edited since); recomputed"])


def test_an_answer_written_with_another_users_key_is_ignored(trace, tmp_path, monkeypatch):
    """A cache folder shared between users: one user's entries never speak in another's report."""
    truth = _json(trace)
    entry = _answer()
    stored = json.loads((entry / S.META).read_text())
    stored["doc"]["verdict"]["summary"] = "written by mallory"
    (entry / S.META).write_text(json.dumps(stored))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "mallory"))     # mallory's own key
    S._noted.clear()
    _resign(entry, "answer")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))      # back to this user
    listing = _cli("cache").stdout
    assert " unverified " in listing and " answer " not in listing    # shown for what it is
    r = _cli("diagnose", "--json", trace)
    assert r.exit_code == 0 and json.loads(r.stdout) == truth
    assert "ignored entry" in r.stderr


def test_swapped_table_files_are_not_read_as_the_other_traces(trace, tmp_path):
    """The audit: ``.arrow`` files swapped between entries, their checksums copied into meta.json,
    were read as the other trace's tables."""
    from srtscope.analyzers.cache import table_cache as C
    from srtscope.analyzers.readers import read_one

    other = tmp_path / "other.sqlite"
    shutil.copyfile(SAMPLES / "healthy.sqlite", other)
    read_one(trace, cache=True)
    read_one(other, cache=True)
    a, b = (_root() / C.trace_key(p, 0).entry_name for p in (trace, other))
    meta_a, meta_b = (json.loads((e / S.META).read_text()) for e in (a, b))
    for t in C.TABLES:
        shutil.copyfile(b / f"{t}.arrow", a / f"{t}.arrow")
        meta_a["tables"][t] = meta_b["tables"][t]
    (a / S.META).write_text(json.dumps(meta_a))
    got = read_one(trace, cache=True)
    want = read_one(trace)
    assert len(got.device) == len(want.device) != len(read_one(other).device)


@pytest.mark.parametrize("problem", ["open_to_others", "inside_cache", "wrong_size", "symlink"])
def test_an_unsafe_key_file_turns_the_cache_off_with_one_line(trace, tmp_path, monkeypatch, problem):
    path = key_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if problem == "open_to_others":
        path.write_bytes(os.urandom(32))
        path.chmod(0o644)
        want = "open to other users"
    elif problem == "inside_cache":
        monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(path.parent))
        want = "lies inside the cache folder"
    elif problem == "wrong_size":
        path.write_bytes(b"short")
        path.chmod(0o600)
        want = "holds 5 bytes"
    else:
        (tmp_path / "real.key").write_bytes(os.urandom(32))
        path.symlink_to(tmp_path / "real.key")
        want = "is a symlink"
    monkeypatch.setattr("srtscope.analyzers.cache.cache_auth._KEYS", {})
    r = _cli("diagnose", "--json", trace)
    assert r.exit_code == 0 and json.loads(r.stdout) == _json("--no-cache", trace)
    (line,) = r.stderr.splitlines()
    assert line.startswith("srtscope: warning: srtscope cache not used: the key file") and want in line


def test_a_new_key_is_private(trace):
    _json(trace)
    st = key_path().stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_size == 32
    assert not key_path().resolve().is_relative_to(_root().resolve())


# -- 4. nothing in the cache folder can hang a look ---------------------------------------------------
@pytest.mark.parametrize("what", ["answer_meta", "answer_marker", "tables_meta", "tables_arrow"])
def test_a_fifo_in_an_entry_does_not_hang(trace, what):
    """The audit: a cache entry's file replaced by a FIFO hung ``diagnose``."""
    from srtscope.analyzers.cache import table_cache as C

    truth = _json(trace)
    entry = _answer() if what.startswith("answer") else _root() / C.trace_key(trace, 0).entry_name
    name = {"answer_meta": S.META, "answer_marker": S.MARKER, "tables_meta": S.META,
            "tables_arrow": "device.arrow"}[what]
    (entry / name).unlink()
    os.mkfifo(entry / name)
    if what.startswith("tables"):
        shutil.rmtree(_answer())             # so that the tables are looked at
    t0 = time.monotonic()
    assert _json(trace) == truth
    assert time.monotonic() - t0 < 30


# -- 8. settings and warnings ------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "1e3", "nan", "-1", "2.5", "99999999999"])
@pytest.mark.parametrize("command", ["diagnose", "cache"])
def test_a_bad_cache_cap_is_one_line_exit_2(trace, value, command):
    """The audit: ``SRTSCOPE_CACHE_MAX_MB=abc|1e3|nan`` silently meant 2048."""
    args = ["diagnose", "--json", str(trace)] if command == "diagnose" else ["cache"]
    r = _cli(*args, env={"SRTSCOPE_CACHE_MAX_MB": value})
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"srtscope: error: $SRTSCOPE_CACHE_MAX_MB={value!r}: expected a whole "
                                     f"number 0..{S.MAX_MB_LIMIT}"]


def test_a_cache_folder_that_is_a_dangling_link_is_one_warning_line(trace, tmp_path, monkeypatch):
    """The audit: two raw Python warning lines, saying "File exists"."""
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(link))
    r = _cli("diagnose", "--json", trace)
    assert r.exit_code == 0
    assert r.stderr.splitlines() == [f"srtscope: warning: srtscope cache not used: {link} is a symlink to nothing"]


def test_a_writer_killed_mid_write_leaves_a_leftover_that_is_listed_and_reclaimed(trace, tmp_path):
    """The audit: SIGKILL during a cache write left a hidden ``.tmp-*`` folder (up to 84 MB) that no
    rerun, cap or ``--clear`` removed and ``srtscope cache`` did not show."""
    import signal

    code = ("import time; from pathlib import Path; from srtscope.analyzers.cache.cache_store import CacheStore\n"
            "def write(folder):\n"
            "    (folder / 'device.arrow').write_bytes(b'\\0' * 300_000)\n"
            "    print('writing', flush=True)\n"
            "    time.sleep(60)\n"
            "CacheStore().publish('0123456789abcdef0123456789abcdef', 'tables', write)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert p.stdout is not None and p.stdout.readline().strip() == "writing"
    (tmp,) = [d for d in _root().iterdir() if d.name.startswith(".tmp-")]
    assert "being written now" in _cli("cache").stdout            # alive: left alone
    p.send_signal(signal.SIGKILL)
    p.wait()
    listing = _cli("cache").stdout
    assert "leftover" in listing and tmp.name in listing and "293 KiB" in listing
    r = _cli("cache", "--clear")
    assert r.exit_code == 0 and "1 leftover of killed runs" in r.stdout
    assert not tmp.exists()
