"""scripts/gpu_check.sh rehearsed on the CPU: the same runs, captures, diagnoses and figures that a
GPU session runs once with its scarce device time, so that the script cannot rot unseen."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_rehearsal_on_cpu(tmp_path):
    out = tmp_path / "check"
    env = dict(os.environ, PYTHON=sys.executable, SRTSCOPE_CHECK_DEVICE="cpu", SRTSCOPE_CHECK_REQUESTS="8")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    figures = json.loads((out / "figures.json").read_text())
    assert set(figures) == {"graphs_overlap", "eager_fallback"}
    for name, f in figures.items():
        assert f["output_tok_per_s"] > 0 and f["attention_backend"] == "torch_native", name
        assert f["steps_eager"] > 0 and f["eager_reasons"] == {"no_cuda": f["steps_eager"]}, name
        assert f["verdict"] in {"scheduler", "prep", "kernel"} and 0 <= f["bubble_share"] <= 1, name
        eager = f["device_times"]["run.eager"]      # CUDA events exist on a GPU only
        assert eager["spans"] >= f["steps_eager"] and eager["with_device_time"] == 0, name
        kineto = f["captures"]["kineto.json.gz"]
        # the Kineto capture names our stages, and its forwards stand in for device activity
        assert kineto["diagnosed"] and kineto["stage_names"] >= 6, name
        assert kineto["verdict"] in {"scheduler", "prep", "kernel"} and kineto["steps_eager"] > 0, name
        assert (out / f"{name}.kineto.json.gz").stat().st_size > 0
    assert "decode steps graph-replayed" in p.stdout
    assert "mean step" in p.stdout and "idle while the host was in prep" in p.stdout, \
        p.stdout[p.stdout.find("== compare"):][:3000]                        # the two runs compared
    # what a device machine hands back: a handful of flat files
    kept = sorted(f.name for f in (out / "bundle").iterdir())
    assert len(kept) <= 8 and "figures.json" in kept and "graphs_overlap.kineto.json.gz" in kept
    assert "eager_fallback.probe.diagnosis.json" in kept
    # the what-if's eager-fallback accuracy ran (on the CPU, a rehearsal that says so) and is kept
    table = (out / "bundle" / "what_if_eager.txt").read_text()
    assert "| eager fallback (graphs up to bs 4) |" in table and "is a rehearsal" in table
    pairs = json.loads((out / "what_if_eager.json").read_text())
    assert [c["case"]["fault"] for c in pairs] == ["eager"] and len(pairs[0]["pairs"]) == 5


def test_gpu_check_refuses_a_machine_without_cuda(tmp_path):
    # scenario: run on a machine without a GPU by mistake: one clear line, before any device work
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("SRTSCOPE_CHECK_DEVICE", None)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "x")], env=env,
                       capture_output=True, text=True, timeout=120)
    if "available=True" in p.stdout:
        pytest.skip("this machine has CUDA")
    assert p.returncode == 2
    assert "no CUDA device; SRTSCOPE_CHECK_DEVICE=cpu" in p.stderr
