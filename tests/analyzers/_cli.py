"""Run ``srtscope`` in a subprocess for the hostile-input tests: a timeout bounds every case, the
child's peak RSS is measured, and the README's promise is checked (exit code, one stderr line)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 90
# a wrapper process whose only child is the CLI: its RUSAGE_CHILDREN peak is the CLI's own
_WRAP = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[2:]); "
         "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
         "sys.exit(r.returncode)")


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    peak_rss_mb: float

    def error_line(self, *needles: str) -> str:
        """Assert exit 2 with one ``srtscope: error:`` line holding each needle; return it."""
        lines = self.stderr.strip().splitlines()
        assert self.code == 2, (self.code, self.stderr[-2000:])
        assert len(lines) == 1, self.stderr[-2000:]
        assert lines[0].startswith("srtscope: error: "), lines[0]
        for n in needles:
            assert n in lines[0], (n, lines[0])
        return lines[0]


def srtscope(*args: str | Path, timeout: float = TIMEOUT_S) -> Result:
    """``srtscope ARGS`` (the installed entry point, ``python -m srtscope``); fails the test on a hang."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        cmd = [sys.executable, "-c", _WRAP, rss.name, sys.executable, "-m", "srtscope", *map(str, args)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env={**os.environ, "COLUMNS": "200"})
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"srtscope {' '.join(map(str, args))} ran past {timeout} s") from None
        kb = rss.read().strip()
    return Result(proc.returncode, out, err, int(kb) / 1024 if kb else float("nan"))
