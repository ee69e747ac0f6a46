"""``--help`` reads as written at 80 columns: plain text (no markup eaten: ``srtscope[cluster]``
stays), no ``<bool>`` metavar on flags, no word split across lines, each command's first line whole."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from srtscope.cli.app import app

runner = CliRunner()
COMMANDS = ["run", "capture", "diagnose", "compare", "cache"]


def _help(*args: str) -> str:
    r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_command_help_fits_and_splits_no_word(cmd):
    text = _help(cmd)
    assert "<bool>" not in text and "…" not in text
    for line in text.splitlines():
        assert len(line) <= 80, line
        assert not re.search(r"[A-Za-z]-$", line), f"word split at a hyphen: {line!r}"


def test_cluster_extra_is_named_in_the_help():
    for cmd in ("diagnose", "compare"):
        assert "Needs srtscope[cluster]; not with --jobs." in " ".join(_help(cmd).split())


def test_run_help_names_its_values():
    text = " ".join(_help("run").split())
    for shown in ("-n, --requests N", "--inject STAGE=US", "-o, --out DIR", "--model PATH", "--html FILE",
                  "--markdown FILE", "--overlap / --no-overlap", "shared-prefix (the default), multi-turn"):
        assert shown in text, shown


def test_command_list_shows_each_first_line_whole():
    text = " ".join(_help().split())
    assert "run Run the reference engine with probes on, write its traces, and diagnose them." in text
    assert "..." not in text.split("Commands:")[1]


def test_command_list_shows_each_summary_as_whole_sentences():
    """The audit: ``capture`` and ``compare`` were cut mid-sentence (their summaries wrap in the
    docstring): each command's first paragraph is shown whole, ending with its full stop."""
    listing = _help().split("Commands:")[1]
    entries = re.split(r"\n  (?=\w)", "\n" + listing.rstrip())[1:]
    assert [e.split()[0] for e in entries] == COMMANDS
    for e in entries:
        assert " ".join(e.split()).endswith("."), e
    text = " ".join(listing.split())
    assert "or profile a running server (--server)." in text and "kernels and ranges per step." in text
