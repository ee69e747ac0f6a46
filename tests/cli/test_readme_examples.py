"""README.md's "Using it" examples run as written: each ``srtscope`` line of its bash blocks, in a
fresh folder after ``make demo``'s own command, with only the paths that stand for the user's files
substituted (an nsys export, a Kineto trace, a checkpoint folder). ``capture`` lines need nsys or
the user's server and are left out. The demo must give the verdict the README promises."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
BIN = Path(sys.executable).parent / "srtscope"


def readme_lines() -> list[str]:
    """The ``srtscope`` command lines of the bash blocks in README.md's "Using it" section,
    comments dropped."""
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Using it")
    section = text[start:text.index("\n## ", start + 1)]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line.startswith("srtscope "):
                lines.append(line)
    return lines


def demo_command() -> str:
    """``make demo``'s srtscope command line, its variables expanded."""
    mk = (REPO / "Makefile").read_text()
    args = re.search(r"^DEMO_ARGS \?= (.*)$", mk, flags=re.M).group(1)
    line = re.search(r"^demo:.*\n\t(.*)$", mk, flags=re.M).group(1)
    return line.replace("$(VENV)/bin/srtscope", "srtscope").replace("$(DEMO_ARGS)", args)


def test_readme_lines_are_found():
    lines = readme_lines()
    assert len(lines) >= 10 and lines[0] == "srtscope run"
    assert any("--model" in ln for ln in lines) and any(ln.startswith("srtscope capture") for ln in lines)
    assert demo_command().startswith("srtscope run --out runs/demo --requests")


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny Qwen2 checkpoint folder for the ``--model`` line (None without transformers: that line
    alone is left out)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    from srtscope.engine.workloads import SAMPLE_TEXT
    from tests.engine.hf_helpers import tiny_hf_checkpoint, tiny_tokenizer

    path = tmp_path / "models" / "ckpt"
    tiny_hf_checkpoint(path, "qwen2", seed=9)
    tiny_tokenizer(path, words=SAMPLE_TEXT.split())
    return path


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN.parent}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="100")
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_every_readme_example_runs_as_written(tmp_path, checkpoint):
    if not BIN.exists():
        pytest.skip(f"no srtscope script beside {sys.executable}")
    subst = {   # the README's stand-ins for the user's own files
        "report.sqlite": SAMPLES / "scheduler_bound.sqlite",
        "trace.json.gz": SAMPLES / "profiler_steps.json.gz",
        "before.sqlite": SAMPLES / "healthy.sqlite",
        "after.sqlite": SAMPLES / "scheduler_bound.sqlite",
        "~/models/Qwen2.5-0.5B-Instruct": checkpoint,
        "runs/vllm.pid*.json.gz": SAMPLES / "vllm_instrument_sched.json.gz",   # capture --instrument vllm's
    }
    demo = _run(demo_command() + " --json", tmp_path)
    assert demo.returncode == 0, demo.stderr
    verdict = json.loads(demo.stdout)["verdict"]
    assert (verdict["bottleneck"], verdict["cause"]) == ("scheduler", "sched_cpu")     # what the README says

    for line in readme_lines():
        if line.startswith("srtscope capture") or ("--model" in line and checkpoint is None):
            continue
        words = [str(subst.get(w, w)) for w in shlex.split(line)]
        cmd = " ".join(w if "*" in w else shlex.quote(w) for w in words)     # globs stay globs
        r = _run(cmd, tmp_path)
        ok = {0, 3} if "--fail-on-regression" in words else {0}                # 3: a regression, documented
        assert r.returncode in ok, f"{line}\n-> {cmd}\nexit {r.returncode}: {r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, line
        for opt in ("--markdown", "--html", "--perfetto"):
            if opt in words:
                assert (tmp_path / words[words.index(opt) + 1]).stat().st_size > 0, (line, opt)
