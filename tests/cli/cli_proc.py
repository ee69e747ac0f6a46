"""Run the real ``srtscope`` entry point in a subprocess with a timeout (hostile cases must end),
and check the README's promise: the exit code, and exactly one ``srtscope: error:`` line."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
CLI = [sys.executable, "-m", "srtscope"]
TIMEOUT_S = 60            # a bound on every case: a hang fails the test instead of the suite


@dataclass(frozen=True)
class Done:
    code: int
    stdout: str
    stderr: str

    def one_error_line(self, code: int = 2, *needles: str) -> str:
        """Assert exit ``code`` with exactly one stderr line ``srtscope: error: ...`` holding each
        of ``needles``; return that line."""
        lines = self.stderr.strip().splitlines()
        assert self.code == code, (self.code, self.stdout[-2000:], self.stderr[-2000:])
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith("srtscope: error: "), lines[0]
        for n in needles:
            assert n in lines[0], (n, lines[0])
        assert "Traceback" not in self.stdout + self.stderr
        return lines[0]


_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _PR_CAPBSET_DROP = 1, 2, 24


def as_unprivileged() -> None:
    """``preexec_fn``: make permission bits apply to root too, by dropping the capabilities that
    bypass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from the bounding set before exec; a no-op
    for other users, whom the bits bind anyway."""
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def srtscope(*args: object, timeout: float = TIMEOUT_S, cwd: Path | None = None,
             unprivileged: bool = False, umask: int | None = None) -> Done:
    """``python -m srtscope ARGS`` in a subprocess, ended by ``timeout`` seconds at most."""
    def preexec() -> None:
        if umask is not None:
            os.umask(umask)
        if unprivileged:
            as_unprivileged()

    env = {**os.environ, "COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       cwd=cwd, env=env, preexec_fn=preexec)
    return Done(p.returncode, p.stdout, p.stderr)
