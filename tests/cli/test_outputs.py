"""Item 1 of issue 14: outputs are regular files only, written atomically with the user's umask.

Hostile targets are made here: FIFOs (os.mkfifo), directories, symlinks (to a file and dangling),
/dev/null, a path under a file. Each is refused with exit 2 and one line, and left as it was.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from cli_proc import SAMPLES, srtscope

from srtscope.cli.output import OutputError, check_output_path, write_json, write_text

TRACE = SAMPLES / "healthy.sqlite"


def _hostile(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path of ``kind`` and the words its refusal names."""
    target = tmp_path / "report.out"
    if kind == "fifo":
        os.mkfifo(target)
        return target, "is a FIFO"
    if kind == "directory":
        target.mkdir()
        return target, "is a directory"
    if kind == "symlink":
        real = tmp_path / "real.txt"
        real.write_text("keep me")
        target.symlink_to(real)
        return target, "is a symlink"
    if kind == "dangling-symlink":
        target.symlink_to(tmp_path / "nowhere" / "x")
        return target, "is a symlink"
    if kind == "char-device":
        return Path("/dev/null"), "is a character device"
    if kind == "under-a-file":
        (tmp_path / "afile").write_text("x")
        return tmp_path / "afile" / "report.out", "not a directory"
    raise AssertionError(kind)


def _fingerprint(p: Path) -> tuple:
    st = os.lstat(p) if os.path.lexists(p) else None
    if st is None:
        return ("absent",)
    link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
    return (stat.S_IFMT(st.st_mode), st.st_ino, link)


KINDS = ["fifo", "directory", "symlink", "dangling-symlink", "char-device", "under-a-file"]


@pytest.mark.parametrize("option, kind", [("--perfetto", k) for k in KINDS]
                         + [("--markdown", "fifo"), ("--markdown", "symlink")])
def test_diagnose_refuses_a_target_that_is_not_a_regular_file(tmp_path, option, kind):
    target, words = _hostile(tmp_path, kind)
    before = _fingerprint(target)
    done = srtscope("diagnose", TRACE, option, target)
    done.one_error_line(2, str(target), words)
    assert _fingerprint(target) == before                      # left exactly as it was
    if kind == "symlink":
        assert (tmp_path / "real.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp file left


def test_run_refuses_out_files_that_are_special(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "diagnosis.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    (out / "probe.rank0.json").symlink_to(tmp_path / "elsewhere.json")
    done = srtscope("run", "--requests", 2, "--max-new-tokens", 2, "--device", "cpu", "--out", out)
    line = done.one_error_line(2)
    assert "is a FIFO" in line or "is a symlink" in line
    assert stat.S_ISFIFO(os.lstat(out / "diagnosis.json").st_mode)
    assert (out / "probe.rank0.json").is_symlink() and (tmp_path / "elsewhere.json").read_text() == "{}"


def test_run_out_that_is_a_file_is_bad_input(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    srtscope("run", "--requests", 2, "--out", f).one_error_line(2, str(f), "not a directory")
    srtscope("run", "--requests", 2, "--out", f / "sub").one_error_line(2, "not a directory")


def test_capture_refuses_a_fifo_before_running_the_command(tmp_path):
    fifo = tmp_path / "t.json.gz"
    os.mkfifo(fifo)
    marker = tmp_path / "ran"
    done = srtscope("capture", "--backend", "torch", "--out", fifo, "--",
                    sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    done.one_error_line(2, "is a FIFO")
    assert not marker.exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)], ids=["umask022", "umask077"])
def test_outputs_take_the_users_umask_and_replace_regular_files(tmp_path, umask, mode):
    md, pf = tmp_path / "r.md", tmp_path / "b.json"
    md.write_text("old")
    os.chmod(md, 0o600)
    done = srtscope("diagnose", TRACE, "--markdown", md, "--perfetto", pf, umask=umask)
    assert done.code == 0, done.stderr
    assert md.read_text().startswith("# srtscope diagnosis")
    for p in (md, pf):
        assert stat.S_IMODE(os.stat(p).st_mode) == mode, (p, oct(os.stat(p).st_mode))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "r.md"]   # no temp files


def test_output_module_refuses_links_and_special_files(tmp_path):
    real = tmp_path / "real"
    real.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OutputError, match="is a symlink"):
        write_text(link, "new")
    assert real.read_text() == "keep" and link.is_symlink()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OutputError, match="is a FIFO"):
        write_json(tmp_path / "fifo", {"a": 1})
    with pytest.raises(OutputError, match="(?i)nan"):
        write_json(tmp_path / "nan.json", {"a": float("nan")})
    assert not (tmp_path / "nan.json").exists()
    assert check_output_path(tmp_path / "absent") == tmp_path / "absent"
    write_json(tmp_path / "ok.json", {"a": 1})
    assert (tmp_path / "ok.json").read_text() == '{\n  "a": 1\n}\n'
