"""The command line's heap setting (``pipeline/heap.py``): taken by glibc where it runs, left alone
with ``SRTSCOPE_KEEP_HEAP=0``; checked in a child process, never in the test runner's own heap."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "from srtscope.analyzers.pipeline.heap import keep_freed_pages; print(keep_freed_pages())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("env, taken", [("", "True"), ("0", "False")])
def test_keep_freed_pages(env, taken):
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SRTSCOPE_KEEP_HEAP": env})
    assert out.returncode == 0 and out.stdout.strip() == taken, out.stderr
