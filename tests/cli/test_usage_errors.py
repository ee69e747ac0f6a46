"""Item 8 of issue 14: every usage error is one line ``srtscope: error: ...`` with exit 2 — unknown
options and commands, missing arguments and values, values of the wrong type — never click's box."""
from __future__ import annotations

import pytest
from cli_proc import SAMPLES, srtscope
from typer.testing import CliRunner

from srtscope.cli.app import app

TRACE = str(SAMPLES / "healthy.sqlite")

CASES = {
    "unknown option": (["run", "--bogus"], "No such option"),
    "unknown root option": (["--bogus"], "No such option"),
    "unknown command": (["frobnicate"], "No such command"),
    "missing argument": (["diagnose"], "Missing argument"),
    "missing second argument": (["compare", TRACE], "Missing argument"),
    "option without its value": (["diagnose", TRACE, "--steps"], "requires an argument"),
    "not an integer": (["run", "--requests", "many"], "--requests"),
    "below the minimum": (["run", "-n", "0"], "--requests"),
    "not a float": (["diagnose", TRACE, "--threshold-us", "fast"], "--threshold-us"),
    "not a choice": (["run", "--workload", "nope"], "--workload"),
    "bad backend": (["capture", "--backend", "perf", "--", "true"], "--backend"),
}


@pytest.mark.parametrize("args, needle", CASES.values(), ids=CASES.keys())
def test_usage_error_is_one_line_exit_2(args, needle):
    r = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srtscope: error: ") and needle in lines[0], r.stderr
    assert "╭" not in r.stderr and "Usage:" not in r.stderr and not r.stdout


@pytest.mark.parametrize("args, needle", [(["run", "--bogus"], "No such option"),
                                          (["frobnicate"], "No such command"),
                                          (["diagnose"], "Missing argument")])
def test_the_installed_entry_point_says_one_line_too(args, needle):
    srtscope(*args).one_error_line(2, needle, "--help")


def test_help_and_version_still_work():
    r = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0 and "--requests" in r.stdout
    r = CliRunner().invoke(app, [])
    assert r.exit_code == 2 and "Usage" in r.stdout     # bare srtscope: the help, as before
    done = srtscope("--version")
    assert done.code == 0 and done.stdout.startswith("srtscope ")
