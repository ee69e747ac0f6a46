"""Item 13 of issue 14: two ``srtscope run`` into one ``--out`` never mix. The folder is locked
(``fcntl.flock`` on ``OUT/.srtscope.lock``) for the whole run; a second run fails at once with one
line and exit 2 (it does not wait)."""
from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess

from cli_proc import CLI, TIMEOUT_S, Done, srtscope

from srtscope.cli.output import LOCK_NAME

SMALL = ["run", "--requests", "2", "--max-new-tokens", "2", "--device", "cpu", "--json"]


def test_a_held_lock_fails_the_second_run_at_once(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with open(out / LOCK_NAME, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        done = srtscope(*SMALL, "--out", out, timeout=30)
    done.one_error_line(2, str(out), "another srtscope run")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]     # nothing written


def test_concurrent_runs_never_print_each_others_diagnosis(tmp_path):
    # scenario: A injects 40 ms of prep per step (its diagnosis says prep), B injects nothing;
    # started together into one folder, every run that succeeds prints its own diagnosis
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    procs = {name: subprocess.Popen([*CLI, *SMALL, "--out", str(out), *extra], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env,
                                    preexec_fn=lambda: os.umask(0o022))
             for name, extra in (("A", ["--inject", "prep=40000"]), ("B", []))}
    done = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=TIMEOUT_S * 2)
        done[name] = Done(p.returncode, stdout, stderr)
    assert {d.code for d in done.values()} <= {0, 2} and 0 in {d.code for d in done.values()}, done
    for name, d in done.items():
        if d.code == 2:
            d.one_error_line(2, "another srtscope run")
            continue
        doc = json.loads(d.stdout)
        prep = doc["bubbles"]["by_class"]["prep"]      # A: >= 40 ms per step after the first; B: a few ms
        assert (prep >= 30_000_000) == (name == "A"), (name, prep, doc["verdict"]["summary"])
    # the files of the run are regular files with the umask's mode (0644), the probe traces too
    for name in ("probe.rank0.json", "chrome.rank0.json", "diagnosis.json", "workload_report.json"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o644, name
