"""`srtscope capture` (nsys backend) end to end against a stand-in `nsys` executable on PATH.

Nsight Systems cannot be installed here; the stand-in behaves like its two subcommands as capture
uses them (``profile`` runs the command and writes NAME.nsys-rep; ``export --type=sqlite`` writes
the SQLite file), so what is tested is ours: the invocations, exit codes, files and messages.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "prep_bound.sqlite"

FAKE_NSYS = r'''#!{python}
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NSYS_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
opts = {{a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}}
if args[0] == "profile":
    command = [a for a in args[1:] if not a.startswith("--")]
    code = subprocess.call(command)
    if os.environ.get("FAKE_NSYS_NO_REPORT") != "1":
        report = opts["--output"]          # like nsys: the extension is appended when missing
        open(report if report.endswith(".nsys-rep") else report + ".nsys-rep", "w").write("report")
    sys.exit(code)
if args[0] == "export":
    if os.environ.get("FAKE_NSYS_EXPORT_FAILS") == "1":
        sys.exit(5)
    assert opts["--type"] == "sqlite" and os.path.exists(args[-1])
    shutil.copy(os.environ["FAKE_NSYS_SAMPLE"], opts["--output"])
    sys.exit(0)
sys.exit(64)
'''


@pytest.fixture
def nsys_on_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "nsys.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_NSYS_LOG=str(log),
               FAKE_NSYS_SAMPLE=str(SAMPLE), PYTHONPATH=str(REPO))
    return env, log


def srtscope(env: dict, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "srtscope.cli.app", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_profile_then_export_then_diagnose(nsys_on_path, tmp_path):
    # scenario: a user's command exits 3 under nsys: its code comes back, the SQLite is exported
    env, log = nsys_on_path
    out = tmp_path / "caps" / "serve"
    p = srtscope(env, "capture", "--capture-range", "--out", out, "--",
                 sys.executable, "-c", "import sys; sys.exit(3)")
    assert p.returncode == 3, p.stderr
    assert f"wrote {out}.sqlite" in p.stderr
    profile, export = [json.loads(line) for line in log.read_text().splitlines()]
    assert profile[0] == "profile" and "--capture-range=cudaProfilerApi" in profile
    assert profile[-3:] == [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert export[:2] == ["export", "--type=sqlite"] and export[-1] == f"{out}.nsys-rep"
    d = srtscope(env, "diagnose", f"{out}.sqlite", "--json")
    assert d.returncode == 0, d.stderr
    assert json.loads(d.stdout)["verdict"]["bottleneck"] == "prep"


def test_failed_export_is_one_line_and_internal(nsys_on_path, tmp_path):
    env, _ = nsys_on_path
    env["FAKE_NSYS_EXPORT_FAILS"] = "1"
    p = srtscope(env, "capture", "--out", tmp_path / "cap", "--", sys.executable, "-c", "pass")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        f"srtscope: error: nsys export failed with exit code 5 for {tmp_path / 'cap'}.nsys-rep"]


def test_no_report_says_so_and_keeps_the_exit_code(nsys_on_path, tmp_path):
    # scenario: the command never reached cudaProfilerStart, so nsys wrote no report
    env, log = nsys_on_path
    env["FAKE_NSYS_NO_REPORT"] = "1"
    p = srtscope(env, "capture", "--out", tmp_path / "cap", "--", sys.executable, "-c", "pass")
    assert p.returncode == 0
    assert "nsys wrote no report" in p.stderr and not (tmp_path / "cap.sqlite").exists()
    assert len(log.read_text().splitlines()) == 1          # no export attempted
