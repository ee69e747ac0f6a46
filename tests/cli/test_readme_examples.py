"""The examples of README.md and of the guides in docs/ run as written: each ``srtscope`` line of
their bash blocks, in a fresh folder (README's after ``make demo``'s own command), with only the
paths that stand for the user's files substituted (an nsys export, a Kineto trace, a vLLM profiler
trace, rank exports, a checkpoint folder). ``capture`` lines need nsys or the user's server and are
left out. The demo must give the verdict the README promises."""
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


def bash_lines(path: Path) -> list[str]:
    """The ``srtscope`` command lines of the bash blocks in ``path``, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line.startswith("srtscope "):
                lines.append(line)
    return lines


def readme_lines() -> list[str]:
    """The ``srtscope`` command lines of README.md's bash blocks."""
    return bash_lines(REPO / "README.md")


GUIDES = sorted(p.name for p in (REPO / "docs").glob("*.md"))


def guide_lines(name: str) -> list[str]:
    """The ``srtscope`` command lines of ``docs/NAME``'s bash blocks."""
    return bash_lines(REPO / "docs" / name)


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
    for opt in ("--full", "--html", "--json", "--markdown", "--perfetto", "--fail-on-regression", "--figure",
                "--min-change-us"):
        assert any(opt in ln.split() for ln in lines), opt
    assert demo_command().startswith("srtscope run --out runs/demo --requests")


def test_guide_lines_are_found():
    """The guides hold examples, and those that are not ``capture`` lines are run below."""
    found = {name: guide_lines(name) for name in GUIDES}
    for name in ("capture.md", "engines.md", "tp.md", "cache.md", "memory.md", "engine.md"):
        assert any(not ln.startswith("srtscope capture") for ln in found[name]), name
    assert any("--server" in ln for ln in found["capture.md"])


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


#: the examples' stand-ins for the user's own files
SUBST = {
    "report.sqlite": SAMPLES / "scheduler_bound.sqlite",
    "trace.json.gz": SAMPLES / "profiler_steps.json.gz",
    "before.sqlite": SAMPLES / "healthy.sqlite",
    "after.sqlite": SAMPLES / "scheduler_bound.sqlite",
    "rank0.sqlite": SAMPLES / "comm_straggler.rank0.sqlite",
    "rank1.sqlite": SAMPLES / "comm_straggler.rank1.sqlite",
    "/tmp/vt/rank0.*.pt.trace.json.gz": SAMPLES / "vllm" / "vllm_cpu_prep.pt.trace.json.gz",   # vLLM's profiler's
    "runs/vllm.pid*.json.gz": SAMPLES / "vllm_instrument_sched.json.gz",   # capture --instrument vllm's
    "runs/vllm.json.gz": SAMPLES / "vllm_instrument_sched.json.gz",        # its processes merged
    "/tmp/st/*-TP-0.trace.json.gz": SAMPLES / "sglang" / "sglang_offline_prep.trace.json.gz",   # SGLang's profiler's
}


def run_lines(lines: list[str], cwd: Path, checkpoint: Path | None) -> None:
    """Run each line as written but for the stand-ins; ``capture`` lines (nsys, the user's server)
    and, without transformers, ``--model`` lines are left out."""
    subst = dict(SUBST, **{"~/models/Qwen2.5-0.5B-Instruct": checkpoint})
    for line in lines:
        if line.startswith("srtscope capture") or ("--model" in line and checkpoint is None):
            continue
        words = [str(subst.get(w, w)) for w in shlex.split(line)]
        cmd = " ".join(w if "*" in w else shlex.quote(w) for w in words)     # globs stay globs
        r = _run(cmd, cwd)
        ok = {0, 3} if "--fail-on-regression" in words else {0}                # 3: a regression, documented
        assert r.returncode in ok, f"{line}\n-> {cmd}\nexit {r.returncode}: {r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, line
        for opt in ("--markdown", "--html", "--perfetto"):
            if opt in words:
                assert (cwd / words[words.index(opt) + 1]).stat().st_size > 0, (line, opt)


def test_every_readme_example_runs_as_written(tmp_path, checkpoint):
    if not BIN.exists():
        pytest.skip(f"no srtscope script beside {sys.executable}")
    demo = _run(demo_command() + " --json", tmp_path)
    assert demo.returncode == 0, demo.stderr
    verdict = json.loads(demo.stdout)["verdict"]
    assert (verdict["bottleneck"], verdict["cause"]) == ("scheduler", "sched_cpu")     # what the README says
    run_lines(readme_lines(), tmp_path, checkpoint)


def test_every_guide_example_runs_as_written(tmp_path, request):
    """docs/*.md's examples, each guide's in order in a folder of its own; a line the README already
    runs is not run twice."""
    if not BIN.exists():
        pytest.skip(f"no srtscope script beside {sys.executable}")
    seen = set(readme_lines())
    todo = []
    for name in GUIDES:
        lines = [ln for ln in guide_lines(name) if ln not in seen]
        seen.update(lines)
        todo.append((name, lines))
    needs_model = any("--model" in ln for _, lines in todo for ln in lines)
    checkpoint = request.getfixturevalue("checkpoint") if needs_model else None
    for name, lines in todo:
        folder = tmp_path / name.removesuffix(".md")
        folder.mkdir()
        run_lines(lines, folder, checkpoint)
