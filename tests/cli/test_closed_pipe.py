"""A reader that stops early (``srtscope diagnose ... | head``) ends srtscope quietly with exit 0
(issue 46: it exited 1, the code kept for internal errors). The pipe's reader is closed before
srtscope starts, so its first write fails whatever the timing."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.cli.cli_proc import CLI, SAMPLES, TIMEOUT_S

TRACE = str(SAMPLES / "healthy.sqlite")


@pytest.mark.parametrize("args", [
    ["diagnose", TRACE, "--no-cache"],                 # the report, printed line by line by rich
    ["diagnose", TRACE, "--no-cache", "--full"],
    ["diagnose", TRACE, "--no-cache", "--json"],       # one write of the document
    ["diagnose", "--help"],                            # click's help, outside any command
    ["--help"],
    ["cache"],
], ids=lambda a: " ".join(x if x != TRACE else "TRACE" for x in a))
def test_a_closed_stdout_is_a_quiet_exit_0(args):
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([*CLI, *args], stdout=w, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    finally:
        os.close(w)
    assert (p.returncode, p.stderr.decode()) == (0, "")


def test_an_error_is_still_one_line_and_exit_2_with_a_closed_stdout(tmp_path):
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([*CLI, "diagnose", str(tmp_path / "missing.sqlite")], stdout=w,
                           stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    finally:
        os.close(w)
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("srtscope: error: ")
